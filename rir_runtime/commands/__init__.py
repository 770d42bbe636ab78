"""The runtime's own commands (`rir envs`, `models`, `play`, `trace`, `env`), one module each. The `rir`
entry point (`rir_runtime/cli.py`) names every command's module; those of the other packages live in
their `commands/` folders (data_gen, eval, train), at the top of their package."""
