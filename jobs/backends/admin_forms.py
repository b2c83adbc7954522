"""What the backends' admin forms and management commands share. A backend's form for its own
objects (an instance, a cluster: its forms.py) serves its admin page and its command alike, so
each rule about their settings lives in one place.

A secret (an SSH private key, a kubeconfig) is write-only: a new one replaces the stored one,
encrypted (jobs.secrets); it is never shown back, and left empty it is kept.
"""
import json

from django import forms
from django.contrib import messages
from django.core.exceptions import NON_FIELD_ERRORS
from django.forms.models import model_to_dict


def write_only_secret(rows, help_text):
    """A form field for a secret that is stored encrypted and never shown back (empty: keep it)."""
    return forms.CharField(widget=forms.Textarea(attrs={"rows": rows, "autocomplete": "off"}), required=False,
                           strip=False, help_text=help_text)


def bound(form_class, instance, **values):
    """`form_class` bound to `instance`'s current values (or its model's defaults) with `values` set
    over them (None: empty), posted as a browser would: how a command sets its options and keeps the
    rest. JSON fields go as text (an empty {} or [] would otherwise read as "no value")."""
    data = {**model_to_dict(instance), **values}
    return form_class(data={name: _posted(value) for name, value in data.items()}, instance=instance)


def _posted(value):
    if value is None:
        return ""
    return json.dumps(value) if isinstance(value, (dict, list)) else value


def errors_by_option(form, options):
    """The form's errors on one line, each named by the command option that set its field:
    "--gpus: Must be at least 1.". `options` names the fields whose option is called otherwise
    ({"private_key": "--key-file"}); a field spelled with _ is also named as the admin has it:
    "--kueue-queue/kueue_queue: ..."."""
    def name(field):
        if field == NON_FIELD_ERRORS:
            return ""
        if field in options:
            return f"{options[field]}: "
        option = "--" + field.replace("_", "-")
        return f"{option}/{field}: " if "_" in field else f"{option}: "

    return "; ".join(name(field) + " ".join(messages) for field, messages in form.errors.items())


def report_checks(model_admin, request, queryset, check, words):
    """Run `check(obj) -> (ok, what)` on each selected row and say how each went."""
    for obj in queryset:
        ok, what = check(obj)
        model_admin.message_user(request, f"{obj.name}: {words[0] if ok else words[1]}: {what}",
                                 messages.SUCCESS if ok else messages.WARNING)
