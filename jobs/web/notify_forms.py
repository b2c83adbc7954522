"""The settings page's notification forms: a target (checked where it points before it is
stored, encrypted) and which events reach the targets."""
import secrets

from django import forms
from django.core.exceptions import ValidationError
from django.core.validators import EmailValidator, MaxValueValidator

from jobs.domain import destinations, notify_send
from jobs.models import NotificationPreferences, NotificationTarget

MAX_MINUTES = 7 * 24 * 60


class TargetForm(forms.Form):
    kind = forms.ChoiceField(choices=NotificationTarget.Kind.choices, initial=NotificationTarget.Kind.EMAIL)
    name = forms.CharField(max_length=100, required=False, help_text="Optional: what you call it.")
    address = forms.CharField(
        max_length=2000, label="Address or URL", strip=True,
        widget=forms.TextInput(attrs={"autocomplete": "off", "spellcheck": "false"}),
        help_text="An e-mail address; an Apprise URL (slack://..., msteams://..., discord://..., ntfy://...); "
                  "or your webhook's https:// URL. Stored encrypted, never shown again.")
    secret = forms.CharField(max_length=200, required=False, strip=True,
                             widget=forms.PasswordInput(attrs={"autocomplete": "new-password"}),
                             help_text="Webhooks: the key of each request's HMAC-SHA256 signature "
                                       "(X-Ringmaster-Signature); blank: one is made and shown once.")

    def clean(self):
        data = super().clean()
        kind, address = data.get("kind"), data.get("address")
        if not kind or not address:
            return data
        try:
            data["shown"] = getattr(self, f"_clean_{kind}")(address)
        except ValidationError as error:
            self.add_error("address", error)
        return data

    def _clean_email(self, address):
        EmailValidator(message="Give an e-mail address.")(address)
        user, _, domain = address.rpartition("@")
        return f"{user[:1]}…@{domain}"

    def _clean_apprise(self, address):
        try:
            plugin = notify_send.apprise_plugin(address)
            for host in notify_send.apprise_hosts(plugin):
                destinations.checked(host)
        except (notify_send.Undeliverable, destinations.Refused) as exc:
            raise ValidationError(str(exc)) from None
        return notify_send.shown_apprise_url(plugin)

    def _clean_webhook(self, address):
        try:
            _, host, port, _ = notify_send.webhook_parts(address)
            destinations.checked(host, port)
        except ValueError as exc:
            raise ValidationError(str(exc) if "URL" in str(exc) else "Give a valid http:// or https:// URL.") from None
        except destinations.Refused as exc:
            raise ValidationError(str(exc)) from None
        return notify_send.shown_webhook_url(address)

    def save(self, owner):
        """The stored target, and the webhook secret made for it ("" when none was made)."""
        data = self.cleaned_data
        made = ""
        secret = data.get("secret", "")
        if data["kind"] == NotificationTarget.Kind.WEBHOOK and not secret:
            secret = made = secrets.token_hex(32)
        target = NotificationTarget(owner=owner, kind=data["kind"], name=data.get("name", ""), shown=data["shown"])
        target.set_address(data["address"])
        target.set_secret(secret if data["kind"] == NotificationTarget.Kind.WEBHOOK else "")
        target.save()
        return target, made


class PreferencesForm(forms.ModelForm):
    class Meta:
        model = NotificationPreferences
        fields = ["on_end", "on_wait", "wait_minutes", "on_idle", "idle_minutes"]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for name in ("wait_minutes", "idle_minutes"):
            self.fields[name].validators.append(MaxValueValidator(MAX_MINUTES))
            self.fields[name].widget.attrs.update(min=1, max=MAX_MINUTES)
