"""The property searches (300 generated graphs per pass, each validated on ORT) are slow: they run
with everything (`pytest -m ""`, CI), not in the default fast set; the regression cases they
found (test_regressions.py) stay in it."""

import pytest


@pytest.hookimpl(tryfirst=True)  # before -m "not slow" deselects
def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name.endswith("_properties.py") and item.path.parent.name == "property":
            item.add_marker(pytest.mark.slow)
