"""Each log line once: Django's default logging gives the `django` logger a console handler of its
own under DEBUG (embedded mode, `make run`), which printed every warning beside the root's."""

import logging

import pytest
from django.conf import settings
from django.utils.log import configure_logging


@pytest.fixture
def configured(capsys):
    """Logging configured as the settings do it, writing to the captured stderr."""
    configure_logging(settings.LOGGING_CONFIG, settings.LOGGING)
    yield capsys
    configure_logging(settings.LOGGING_CONFIG, settings.LOGGING)  # handlers on the real stderr again


@pytest.mark.parametrize("debug", [True, False])
@pytest.mark.parametrize("name", ["django.request", "sessions_app.runtime.brain", "celery.worker"])
def test_a_warning_is_written_once(configured, settings, debug, name):
    settings.DEBUG = debug
    configure_logging(settings.LOGGING_CONFIG, settings.LOGGING)  # with this DEBUG, on captured stderr

    logging.getLogger(name).warning("the one line %s", name)

    written = configured.readouterr().err
    assert written.count(f"the one line {name}") == 1, written
    assert f"WARNING {name}: the one line" in written  # the root's format, not Django's bare message
