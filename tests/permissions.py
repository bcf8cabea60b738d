"""Permission bits that hold for the commands a test runs, even when the tests run as root."""

import os
import shutil

import pytest


def permission_bits_apply() -> list[str]:
    """A command prefix under which a folder's permission bits hold: none for a plain user; for
    root, setpriv without the capabilities that let root search and read any folder."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("root reads a folder whatever its permissions, and there is no setpriv to drop that")
    caps = "-dac_override,-dac_read_search"
    return ["setpriv", "--bounding-set", caps, "--inh-caps", caps]
