"""The user's settings page: their API token (create, regenerate, revoke; the key is shown once)
and the group their jobs are charged to by default."""
from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect, render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods

from jobs.domain import quotas, tokens
from jobs.models import UserSettings


class DefaultGroupForm(forms.Form):
    default_group = forms.ModelChoiceField(queryset=None, empty_label=None, label="Charge my jobs to",
                                           help_text="The group a job is charged to when it names none.")

    def __init__(self, *args, user, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["default_group"].queryset = user.groups.order_by("name")


@never_cache            # the page may hold a new key: no cache keeps it
@login_required
@require_http_methods(["GET", "POST"])
def settings_page(request):
    user, new_key = request.user, None
    groups = quotas.groups_of(user)
    group_form = DefaultGroupForm(user=user, initial={"default_group": quotas.default_group(user, groups)})
    if request.method == "POST":
        action = request.POST.get("action")
        if action == "create-token":
            had = tokens.current(user) is not None
            new_key = tokens.issue(user).key       # shown in this answer only, never stored in a message
            messages.success(request, "New API token made; the old one no longer works." if had
                             else "API token made.")
        elif action == "revoke-token":
            if tokens.revoke(user):
                messages.info(request, "API token revoked: it no longer works.")
            return redirect("settings")
        elif action == "default-group":
            group_form = DefaultGroupForm(data=request.POST, user=user)
            if group_form.is_valid():
                UserSettings.objects.update_or_create(
                    user=user, defaults={"default_group": group_form.cleaned_data["default_group"]})
                messages.success(request, f"Jobs are now charged to {group_form.cleaned_data['default_group']} "
                                          "unless they name another group.")
                return redirect("settings")
        else:
            return redirect("settings")
    return render(request, "jobs/settings.html", {
        "token": tokens.current(user), "new_key": new_key, "group_form": group_form if groups else None,
    })
