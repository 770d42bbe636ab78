"""eval's commands (`rir run`, `eval`, `eval-controller`, `pipeline`, `mistakes`, `view`), one module each,
named by the `rir` entry point."""
