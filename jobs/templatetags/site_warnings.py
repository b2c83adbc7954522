"""{% site_warnings %}: what the site's settings leave open, for the admin's pages. The rules are
the system checks' (jobs.checks), so the admin and `manage.py check` say the same."""
from django import template

from jobs import checks

register = template.Library()


@register.simple_tag
def site_warnings():
    return checks.job_network_is_known_and_safe(None) + checks.install_network_is_known_and_safe(None)
