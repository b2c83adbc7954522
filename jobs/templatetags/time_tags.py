"""{% when value "datetime" %}: a time as <time datetime="ISO 8601"> that time.js shows in the
viewer's zone. Its text, for a page without JavaScript, is the portal's zone, labelled."""
from django import template
from django.utils import timezone
from django.utils.dateformat import format as date_format
from django.utils.html import format_html

register = template.Library()

FALLBACK = {"datetime": "Y-m-d H:i:s T", "time": "H:i:s T", "auto": "Y-m-d H:i T"}


@register.simple_tag
def when(value, style="datetime"):
    """`style`: "datetime" (date, time and zone), "time" (time of day) or "auto" (the time of
    day when it is today, else the date and minutes). Nothing for None."""
    if not value:
        return ""
    local = timezone.localtime(value)
    return format_html('<time datetime="{}" data-format="{}">{}</time>', value.isoformat(), style,
                       date_format(local, FALLBACK.get(style, FALLBACK["datetime"])))
