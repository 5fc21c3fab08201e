"""Lets the example scripts run straight from a kvtier checkout.

When the `kvtier` package is not installed, use the checkout's client/python; when
$KVTIER_LIBRARY is unset and the package ships no library, point it at the build
tree's libkvtier.so.0 (build/, as scripts/run builds it). An installed package and
library win over both.
"""

from __future__ import annotations

import ctypes.util
import importlib.util
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def use_checkout() -> None:
    if importlib.util.find_spec("kvtier") is None:
        sys.path.insert(0, str(REPO / "client" / "python"))
    if "KVTIER_LIBRARY" in os.environ:
        return
    spec = importlib.util.find_spec("kvtier")
    if spec is not None and spec.origin is not None and \
            (Path(spec.origin).parent / "libkvtier.so.0").exists():
        return
    if ctypes.util.find_library("kvtier") is not None:  # installed (the .deb)
        return
    build_dir = Path(os.environ.get("KVTIER_BUILD_DIR", REPO / "build"))
    for candidate in (build_dir / "client" / "libkvtier.so.0", build_dir / "libkvtier.so.0"):
        if candidate.exists():
            os.environ["KVTIER_LIBRARY"] = str(candidate)
            return
