"""Install NVIDIA's nvidia-resiliency-ext (NVRx) into this interpreter's environment.

NVRx 0.7.0 publishes one wheel, for CPython 3.12 on glibc 2.39, which ``pip install``
refuses on 3.11, where its Python code runs all the same. So, once and idempotently:
download the pinned wheel, check its :data:`SHA256`, install it ``--no-deps`` into
``<site-packages>/_nvrx`` behind a ``.pth`` file, then its run-time :data:`DEPS`
(docs/results/2026-12-peers.md). ``python -m infra.install_nvrx``, or ``make
bench-peers``. An installer, not a benchmark: it lives with the other set-up scripts.
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

VERSION = "0.7.0"
WHEEL = f"nvidia_resiliency_ext-{VERSION}-cp312-cp312-manylinux_2_39_x86_64.whl"
SHA256 = "e0c646ccae211de81a4c2b5bb5cff96a5e12af1373fb0eb818a40716eef685ad"
"""Of :data:`WHEEL` as PyPI served it on 2026-12-04."""
DEPS = ("pyyaml", "defusedxml", "psutil", "packaging", "httpx", "grpcio")
"""What NVRx imports at run time (its own requirements, less the CUDA ones)."""
PLATFORM = (
    "--only-binary=:all:",
    "--python-version",
    "3.12",
    "--platform",
    "manylinux_2_39_x86_64",
)
"""The only platform NVRx publishes a wheel for."""
TARGET_NAME = "_nvrx"
PTH_NAME = "lazarus_nvrx.pth"


def site_packages() -> Path:
    return Path(sysconfig.get_paths()["purelib"])


def target_dir() -> Path:
    return site_packages() / TARGET_NAME


def installed_version(target: Path) -> str | None:
    """The NVRx version under ``target`` (from its dist-info), or None."""
    found = sorted(target.glob("nvidia_resiliency_ext-*.dist-info"))
    if not found:
        return None
    return found[-1].name.removeprefix("nvidia_resiliency_ext-").removesuffix(".dist-info")


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", *args], check=True)


def install(force: bool = False) -> str:
    """Install NVRx :data:`VERSION` unless it is there; what was done, in words."""
    target = target_dir()
    pth = site_packages() / PTH_NAME
    if not force and installed_version(target) == VERSION and pth.is_file():
        return f"nvidia-resiliency-ext {VERSION} already installed in {target}"
    with tempfile.TemporaryDirectory(prefix="nvrx-wheel-") as tmp:
        pip(
            "download",
            "--quiet",
            "--no-deps",
            *PLATFORM,
            "--dest",
            tmp,
            f"nvidia-resiliency-ext=={VERSION}",
        )
        wheel = Path(tmp) / WHEEL
        if not wheel.is_file():
            raise SystemExit(f"pip download did not produce {WHEEL}: {sorted(Path(tmp).iterdir())}")
        digest = sha256_of(wheel)
        if digest != SHA256:
            raise SystemExit(f"{WHEEL}: sha256 {digest}, expected {SHA256}; not installing it")
        pip(
            "install",
            "--quiet",
            "--no-deps",
            "--upgrade",
            "--ignore-requires-python",
            # pip installs a foreign-platform wheel only into a --target, and only
            # when told the platform it is for.
            *PLATFORM,
            "--target",
            str(target),
            str(wheel),
        )
    pth.write_text(f"{target}\n")
    pip("install", "--quiet", *DEPS)
    return f"installed nvidia-resiliency-ext {VERSION} in {target} (on the path by {pth})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--force", action="store_true", help="install again even if present")
    args = parser.parse_args(argv)
    print(install(force=args.force))
    return 0


if __name__ == "__main__":
    sys.exit(main())
