"""Orchestration: what runs the runtime many times over, above the episode loop and below data_gen,
train and eval. Episode jobs and their append-only files (`jobs.py`), where they run (`executors.py`:
local processes, threads or Ray), the typed configs of YAML plus flags (`config.py`), the cached,
resumable stages of a pipeline (`stages.py`), and training launched as a subprocess, under accelerate
or not (`launch.py`).
"""
