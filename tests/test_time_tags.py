"""{% when %}: a time as <time datetime="ISO 8601 with offset"> for time.js to show in the
viewer's zone; without JavaScript its text is the portal's zone, named."""
from datetime import datetime, timezone

from django.template import Context, Template
from django.test import override_settings

AT = datetime(2026, 11, 25, 6, 15, 2, 123456, tzinfo=timezone.utc)


def render(style):
    return Template('{% load time_tags %}{% when at ' + style + ' %}').render(Context({"at": AT}))


def test_the_iso_time_and_a_labelled_fallback_in_the_portals_zone():
    assert render('"datetime"') == ('<time datetime="2026-11-25T06:15:02.123456+00:00" data-format="datetime">'
                                    '2026-11-25 06:15:02 UTC</time>')
    with override_settings(TIME_ZONE="Asia/Kolkata"):
        assert render('"time"') == ('<time datetime="2026-11-25T06:15:02.123456+00:00" data-format="time">'
                                    '11:45:02 IST</time>')
        assert render('"auto"').endswith('data-format="auto">2026-11-25 11:45 IST</time>')


def test_nothing_for_no_time():
    assert Template('{% load time_tags %}[{% when none %}]').render(Context({"none": None})) == "[]"
