"""eval stage of the RIR pipeline: benchmarks, paired comparisons, reports, the pipeline (see docs/)."""
