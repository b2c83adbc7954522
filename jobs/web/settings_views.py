"""The user's settings page: their API token (create, regenerate, revoke; the key is shown once),
the group their jobs are charged to by default, and their notifications (targets, each with its
log and a Send test button; which events; the wait and idle minutes)."""
from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods

from jobs.domain import notifications, quotas, tokens
from jobs.models import NotificationTarget, UserSettings
from jobs.web.notify_forms import PreferencesForm, TargetForm

TARGET_LOG_LINES = 50


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
    user, new_key, new_secret = request.user, None, ""
    groups = quotas.groups_of(user)
    group_form = DefaultGroupForm(user=user, initial={"default_group": quotas.default_group(user, groups)})
    target_form = TargetForm()
    prefs_form = PreferencesForm(instance=notifications.preferences(user.pk))
    if request.method == "POST":
        action = request.POST.get("action")
        if action == "create-token":
            had = tokens.current(user) is not None
            new_key = tokens.issue(user, read_only=bool(request.POST.get("read_only"))).key   # shown in this answer only
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
        elif action == "add-target":
            target_form = TargetForm(data=request.POST)
            if target_form.is_valid():
                target, new_secret = target_form.save(user)
                messages.success(request, f"Notifications will also go to {target}.")
                if not new_secret:          # a made secret is shown in this answer only
                    return redirect("settings")
                target_form = TargetForm()
        elif action == "notify-preferences":
            prefs_form = PreferencesForm(data=request.POST, instance=notifications.preferences(user.pk))
            if prefs_form.is_valid():
                prefs_form.save()
                messages.success(request, "Notification settings saved.")
                return redirect("settings")
        else:
            return redirect("settings")
    status = 400 if request.method == "POST" and (target_form.errors or prefs_form.errors) else 200
    targets = NotificationTarget.objects.filter(owner=user).order_by("id")
    last = notifications.last_deliveries(targets)
    return render(request, "jobs/settings.html", {
        "token": tokens.current(user), "new_key": new_key, "group_form": group_form if groups else None,
        "targets": [(target, last.get(target.pk)) for target in targets], "target_form": target_form,
        "prefs_form": prefs_form, "new_secret": new_secret,
    }, status=status)


def _own_target(request, target_id):
    """The caller's target; another user's is 404, whoever asks."""
    return get_object_or_404(NotificationTarget, pk=target_id, owner=request.user)


@never_cache
@login_required
@require_http_methods(["GET"])
def target_log(request, target_id):
    target = _own_target(request, target_id)
    return render(request, "jobs/notification_target.html", {
        "target": target, "deliveries": target.deliveries.select_related("job")[:TARGET_LOG_LINES]})


@login_required
@require_http_methods(["POST"])
def target_test(request, target_id):
    delivery = notifications.send_test(_own_target(request, target_id))
    if delivery.status == delivery.Status.DELIVERED:
        messages.success(request, f"Test message delivered to {delivery.target}.")
    else:
        messages.error(request, f"Test message to {delivery.target} not delivered: {delivery.detail}")
    return redirect(f"{reverse('settings')}#notifications")


@login_required
@require_http_methods(["POST"])
def target_delete(request, target_id):
    target = _own_target(request, target_id)
    target.delete()
    messages.info(request, f"Notifications no longer go to {target}.")
    return redirect(f"{reverse('settings')}#notifications")
