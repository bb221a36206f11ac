"""Packaging facts a user relies on: one version, the license, the examples' extra."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

import tfos_nb

REPO = Path(__file__).resolve().parents[1]


def test_setup_reads_the_one_version():
    setup = (REPO / "setup.py").read_text()
    assert "version=_version()" in setup and not re.search(r"version=['\"]\d", setup)
    assert re.fullmatch(r"\d+\.\d+\.\d+", tfos_nb.__version__)


def test_license_file_matches_setup():
    setup = (REPO / "setup.py").read_text()
    assert 'license="Apache-2.0"' in setup
    text = (REPO / "LICENSE").read_text()
    assert text.split()[:4] == ["Apache", "License", "Version", "2.0,"]
    assert "END OF TERMS AND CONDITIONS" in text


def test_examples_without_scikit_learn_say_which_pip_command(monkeypatch):
    from tfos_nb.examples import digits

    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)  # what Python does when it is not installed
    with pytest.raises(ImportError, match=re.escape("pip install 'tfos_nb[examples]'")) as err:
        digits.load_digits_arrays()
    assert err.value.name == "sklearn"
