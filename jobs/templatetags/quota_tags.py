"""{% quota_panel %}: the signed-in user's limits and current use (the job form, "my usage")."""
from django import template

from jobs.domain import quotas

register = template.Library()


@register.inclusion_tag("jobs/_quota_panel.html", takes_context=True)
def quota_panel(context, summary=None):
    """Renders `summary` (quotas.summary), or reads it for the request's user."""
    return {"quota": summary or quotas.summary(context["request"].user)}


@register.filter
def hours(value):
    """GPU-hours as a person reads them: 1,000 / 12.5."""
    return quotas.number(float(value or 0))
