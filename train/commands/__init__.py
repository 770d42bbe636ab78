"""train's commands (`rir train <stage>`, `rir push`), one module each, named by the `rir` entry point."""
