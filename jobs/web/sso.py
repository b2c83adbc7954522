"""Single sign-on through django-allauth: who may sign up (only through a provider), and the
directory's groups applied at every sign-on (jobs.domain.directory). The provider from the
environment is configured in portal.settings (SOCIALACCOUNT_PROVIDERS); more in the admin.

Accounts are matched on the provider's subject alone (SOCIALACCOUNT_EMAIL_AUTHENTICATION off): a
subject seen for the first time becomes a new account, even where a local account has its e-mail.
An admin who wants a local account to sign in through the provider points the provider's account
(Social accounts, in the admin) at it."""
from allauth.account.adapter import DefaultAccountAdapter
from allauth.account.signals import user_logged_in
from allauth.core.exceptions import ImmediateHttpResponse
from urllib.parse import urlsplit

from allauth.socialaccount.adapter import DefaultSocialAccountAdapter, get_adapter
from django.contrib.auth import views as auth_views
from django.dispatch import receiver
from django.http import HttpResponseBadRequest

from jobs.domain import directory


class AccountAdapter(DefaultAccountAdapter):
    def is_open_for_signup(self, request):
        """No one signs up with a password: local accounts are made by an admin."""
        return False


class SocialAccountAdapter(DefaultSocialAccountAdapter):
    def is_open_for_signup(self, request, sociallogin):
        """Whoever the provider vouches for gets an account at their first sign-on."""
        return True

    def pre_social_login(self, request, sociallogin):
        """Connecting a provider's account to the signed-in one is refused: an admin links
        accounts (Social accounts, in the admin)."""
        if sociallogin.state.get("process") == "connect":
            raise ImmediateHttpResponse(HttpResponseBadRequest(
                "process: connecting a provider's account is done by an admin.", content_type="text/plain"))


def provider_origins(request):
    """The origins of the OpenID Connect providers (the settings' and the admin's), in order."""
    origins = []
    for app in get_adapter().list_apps(request):
        url = urlsplit(str((app.settings or {}).get("server_url", "")))
        if url.scheme in ("http", "https") and url.netloc and f"{url.scheme}://{url.netloc}" not in origins:
            origins.append(f"{url.scheme}://{url.netloc}")
    return origins


def allow_providers(request, response):
    """`response` (a page with the sign-on buttons) with its Content-Security-Policy's form-action
    widened to the providers: a button's form is sent on to its provider, and browsers hold the
    redirects after a form to form-action too."""
    origins = provider_origins(request)
    if origins:
        response._csp_update = {"form-action": origins}
    return response


class LoginView(auth_views.LoginView):
    """Django's login page (passwords, throttled by django-axes) with a button per provider."""

    def dispatch(self, request, *args, **kwargs):
        return allow_providers(request, super().dispatch(request, *args, **kwargs))


def claims(extra_data):
    """A provider's claims as allauth keeps them: OpenID Connect's ID token's, overridden by the
    userinfo endpoint's; another provider's (SAML's attributes) as they are."""
    if not isinstance(extra_data, dict):
        return {}
    if "userinfo" in extra_data or "id_token" in extra_data:
        merged = dict(extra_data.get("id_token") or {})
        merged.update(extra_data.get("userinfo") or {})
        return merged
    return extra_data


@receiver(user_logged_in, dispatch_uid="jobs.web.sso.groups_from_the_directory")
def groups_from_the_directory(sender, request, user, sociallogin=None, **kwargs):
    """Every sign-on through a provider (a first one included) sets the user's managed groups."""
    if sociallogin is not None:
        directory.sync_groups(user, directory.claim_values(claims(sociallogin.account.extra_data)))
