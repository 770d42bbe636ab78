"""`rir env`: what a bug report needs, like `accelerate env` and `trl env`.

Versions, devices, Java, caches and the platform, read without loading any model: package
versions come from installed metadata (no imports), and only torch is imported, to ask about GPUs.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
from dataclasses import dataclass

from rir_runtime.cli import package_version

# The packages whose versions decide whether a run reproduces (the environments' engines included).
PACKAGES = (
    "torch",
    "transformers",
    "trl",
    "peft",
    "datasets",
    "accelerate",
    "scienceworld",
    "textworld",
    "scipy",
    "openai",
    "ray",  # an optional extra: "not installed" is a fine answer
)
NO_JAVA = (
    "not found: `--env scienceworld` cannot start (its engine runs on the JVM); builtin and textworld-cooking work"
)


@dataclass(frozen=True)
class Section:
    title: str
    rows: tuple[tuple[str, str], ...]


def versions() -> Section:
    import rir_runtime

    rows = [
        ("rir", f"{package_version('rir')} ({os.path.dirname(os.path.dirname(rir_runtime.__file__))})"),
        ("python", f"{platform.python_version()} ({sys.executable})"),
    ]
    return Section("Versions", tuple(rows + [(name, package_version(name)) for name in PACKAGES]))


def devices() -> Section:
    try:
        import torch
    except ImportError:
        return Section("Devices", (("torch", "not installed: no model can run"),))
    cuda = torch.cuda.is_available()
    count = torch.cuda.device_count() if cuda else 0
    names = [torch.cuda.get_device_name(i) for i in range(count)]
    rows = [("CUDA available", str(cuda)), ("GPUs", ": ".join([str(count), ", ".join(names)]) if names else "0")]
    if cuda:
        rows.append(("CUDA (torch build)", str(torch.version.cuda)))
    rows.append(("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES", "unset")))
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        rows.append(("MPS available", "True"))
    rows.append(("local models run on", "cuda" if cuda else "cpu"))
    return Section("Devices", tuple(rows))


def java() -> Section:
    """`java -version`'s first line; ScienceWorld is the only part that needs it."""
    path = shutil.which("java")
    if path is None:
        return Section("Java", (("java", NO_JAVA),))
    try:
        done = subprocess.run([path, "-version"], capture_output=True, text=True, timeout=30)
        first = (done.stderr or done.stdout).strip().splitlines()
        version = first[0] if done.returncode == 0 and first else f"`java -version` failed (exit {done.returncode})"
    except (OSError, subprocess.TimeoutExpired) as err:
        version = f"`java -version` failed: {err}"
    return Section("Java", (("java", path), ("version", version)))


def caches() -> Section:
    from rir_runtime.llm.registry import cache_root, list_models

    models = list_models()
    prepared = [m.name for m in models if m.prepared]
    missing = [m.name for m in models if not m.prepared]
    rows = [
        ("RIR_CACHE_DIR", os.environ.get("RIR_CACHE_DIR", "unset (default ~/.cache/rir)")),
        ("model cache", str(cache_root())),
        ("prepared models", ", ".join(prepared) or "none"),
        ("not prepared", (", ".join(missing) + " (`rir models prepare <name>`)") if missing else "none"),
    ]
    try:
        from huggingface_hub import constants

        rows.append(("HF hub cache", str(constants.HF_HUB_CACHE)))
        rows.append(("HF_HUB_OFFLINE", str(bool(constants.HF_HUB_OFFLINE))))
    except ImportError:
        rows.append(("HF hub cache", "huggingface_hub not installed"))
    return Section("Caches", tuple(rows))


def platform_info() -> Section:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    rows = [("platform", platform.platform()), ("CPU cores available", str(cores))]
    if hasattr(os, "sysconf") and "SC_PHYS_PAGES" in os.sysconf_names:
        gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
        rows.append(("memory", f"{gib:.1f} GiB"))
    return Section("Platform", tuple(rows))


def collect() -> list[Section]:
    return [versions(), devices(), java(), caches(), platform_info()]


def render(sections: list[Section]) -> str:
    """Markdown-friendly text: paste it into an issue as it is."""
    lines = ["Copy and paste the text below into a bug report.", ""]
    for section in sections:
        lines.append(f"{section.title}:")
        lines += [f"- {key}: {value}" for key, value in section.rows]
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def add_parser(sub: argparse._SubParsersAction, name: str, help_text: str) -> None:
    sub.add_parser(name, help=help_text).set_defaults(handler=report)


def report(args: argparse.Namespace) -> int:
    sys.stdout.write(render(collect()))
    return 0
