"""data_gen stage of the RIR pipeline (see docs/ and DESIGN.md)."""
