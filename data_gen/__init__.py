"""data_gen stage of the RIR pipeline: rollouts, hindsight labels, TRL datasets (see docs/)."""
