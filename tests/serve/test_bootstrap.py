"""serve/bootstrap/options.py (through serve.bootstrap): the host name a cluster's answers carry (X-Strata-Host)."""
import argparse

import pytest

from serve.bootstrap import SetupError, options


def _ns(**kw):
    return argparse.Namespace(**kw)


def test_host_name_from_the_flag_the_config_or_the_environment(monkeypatch):
    monkeypatch.delenv("STRATA_HOST_NAME", raising=False)
    assert options(_ns(), {}).host_name is None
    assert options(_ns(host_name="h1"), {"host_name": "h2"}).host_name == "h1"
    assert options(_ns(), {"host_name": "gpu-3.lab"}).host_name == "gpu-3.lab"
    monkeypatch.setenv("STRATA_HOST_NAME", "h9")
    assert options(_ns(), {}).host_name == "h9"
    assert options(_ns(), {"host_name": "h2"}).host_name == "h2"


@pytest.mark.parametrize("bad", ["", "h 1", "h1\r\nX-Evil: 1", "x" * 65, "é"])
def test_a_host_name_a_header_cannot_carry_is_refused(bad):
    with pytest.raises(SetupError, match="host name"):
        options(_ns(host_name=bad), {})
