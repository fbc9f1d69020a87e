"""Fixtures every Python test may use: where the build, the sources, the shared data and the default model are."""
import os
import subprocess

import pytest

SOURCE_DIR = os.environ.get("KILN_SOURCE_DIR", os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))


@pytest.fixture(scope="session")
def source_dir():
    return SOURCE_DIR


@pytest.fixture(scope="session")
def build_dir():
    d = os.environ.get("KILN_BUILD_DIR")
    if not d:
        pytest.skip("KILN_BUILD_DIR not set (run through ctest)")
    return d


@pytest.fixture(scope="session")
def kiln_bin():
    b = os.environ.get("KILN_BIN")
    if not b or not os.path.exists(b):
        pytest.skip("KILN_BIN not set (run through ctest)")
    return b


@pytest.fixture(scope="session")
def shared_dir():
    return os.environ.get("KILN_SHARED_DIR", os.path.join(SOURCE_DIR, "..", "shared"))


@pytest.fixture(scope="session")
def default_model():
    """Path of the default model (scripts/fetch-model.sh fetches it once if missing)."""
    script = os.path.join(SOURCE_DIR, "scripts", "fetch-model.sh")
    out = subprocess.run([script], check=True, capture_output=True, text=True)
    return out.stdout.strip().splitlines()[-1]
