"""The real DirectML EP host for the tests marked ``dml_host`` (every test folder sees this file).

The host folder (made by ../shared/dml-wine/setup.sh) comes from DMLOPT_DML_HOST, which is taken
out of the environment here: the rest of the suite runs as on a machine without the host (with it,
every `optimize --target dml` would also run on the real EP).  Without a usable host the marked
tests skip and say why.
"""

from __future__ import annotations

import os

import pytest

from dmlopt.errors import DmlOptError
from dmlopt.targets.dml import host as dml_host_mod

DML_HOST = os.environ.pop(dml_host_mod.ENV_VAR, None)


@pytest.fixture(scope="session")
def dml_host() -> dml_host_mod.Host:
    """The checked host folder; a skip with the reason when there is none."""
    if not DML_HOST:
        pytest.skip(f"no DirectML host: set {dml_host_mod.ENV_VAR}=DIR after `bash ../shared/dml-wine/setup.sh DIR` "
                    "(.ci/setup-dml-host.sh does both in CI)")
    try:
        return dml_host_mod.open_host(DML_HOST)
    except DmlOptError as e:
        pytest.skip(f"the DirectML host {DML_HOST} is not usable: {e}")
