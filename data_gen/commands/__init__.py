"""data_gen's commands (`rir rollout`, `rir build-data`), one module each, named by the `rir` entry point."""
