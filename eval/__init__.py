"""eval stage of the RIR pipeline (see docs/ and DESIGN.md)."""
