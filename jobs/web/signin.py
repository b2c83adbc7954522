"""Sign-in throttling (django-axes): after RINGMASTER_SIGNIN_FAILURES failed sign-ins within
RINGMASTER_SIGNIN_LOCKOUT_SECONDS, an account (from any address) and an address (for any account)
are refused until that long after the last failure: the login page and the admin's say so and
when to try again, the API answers 429 with Retry-After. A wrong API token is a failed sign-in
of its address (a token names no account), on the API and on the websocket alike; one rule
(axes' settings, the failures in its table) covers passwords and tokens."""
import math

from django.contrib import admin
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.forms import AuthenticationForm
from django.contrib.auth.signals import user_login_failed
from django.core.exceptions import NON_FIELD_ERRORS
from django.db.models import Max, Q
from django.forms.utils import ErrorDict
from django.http import JsonResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone
from rest_framework import authentication, exceptions, permissions

from axes.handlers.proxy import AxesProxyHandler
from axes.helpers import get_client_username, get_cool_off
from axes.models import AccessAttempt

from jobs.domain import tokens
from jobs.web.sso import allow_providers

# What a wrong token counts as: a failed sign-in of no account.
TOKEN_CREDENTIALS = {"username": None}


class Locked(Exception):
    def __init__(self, seconds):
        super().__init__(f"locked for {seconds} s")
        self.seconds = seconds


def _username(request, credentials):
    """The account a sign-in names (None for a token); `request` may be an attempt axes stored."""
    if credentials or hasattr(request, "POST"):
        return get_client_username(request, credentials)
    return getattr(request, "username", None)


def lockout_parameters(request, credentials=None):
    """AXES_LOCKOUT_PARAMETERS: the account and the address, each on its own; the address alone
    where no account is named (a token), so that those failures are never summed across addresses."""
    return ["username", "ip_address"] if _username(request, credentials) else ["ip_address"]


def retry_after(request, credentials=None):
    """Whole seconds until the lock on this request's account or address ends (at least 1)."""
    AxesProxyHandler.update_request(request)
    username = _username(request, credentials)
    who = Q(ip_address=request.axes_ip_address) | (Q(username=username) if username else Q(pk__in=[]))
    last = AccessAttempt.objects.filter(who).aggregate(last=Max("attempt_time"))["last"]
    if last is None:
        return 1
    left = (last + get_cool_off(request) - timezone.now()).total_seconds()
    return max(1, math.ceil(left))


def message(seconds):
    minutes = math.ceil(seconds / 60)
    when = f"{minutes} minute{'s' if minutes != 1 else ''}" if seconds > 60 else f"{seconds} second{'s' if seconds != 1 else ''}"
    return f"Too many failed sign-ins; try again in {when}."


def _refused(form, text):
    """The login form, unbound (the user name filled in), with `text` as its error."""
    form._errors = ErrorDict({NON_FIELD_ERRORS: form.error_class([text], error_class="nonfield")})
    return form


def lockout_response(request, original_response=None, credentials=None):
    """AXES_LOCKOUT_CALLABLE: the page the request came from, saying when to try again, with 429
    and Retry-After; JSON under /api/. (axes' asynchronous path passes no original response.)"""
    if not isinstance(credentials, dict):
        credentials = getattr(request, "axes_credentials", None)
    seconds = retry_after(request, credentials)
    text = message(seconds)
    if request.path.startswith("/api/"):
        response = JsonResponse({"detail": text}, status=429)
    else:
        username = _username(request, credentials) or ""
        if request.path == reverse("admin:login"):
            form = _refused(AdminAuthenticationForm(request, initial={"username": username}), text)
            context = {**admin.site.each_context(request), "form": form, "title": "Log in",
                       "app_path": request.get_full_path(), "username": username,
                       "next": request.POST.get("next", request.GET.get("next", ""))}
            template = "admin/login.html"
        else:
            form = _refused(AuthenticationForm(request, initial={"username": username}), text)
            context = {"form": form, "next": request.POST.get("next", request.GET.get("next", ""))}
            template = "registration/login.html"
        response = allow_providers(request, render(request, template, context, status=429))
    response["Retry-After"] = str(seconds)
    return response


def working_token(request, key):
    """The working API token (tokens.working) whose key is `key`, or None for a wrong, expired or
    revoked one, or one of a deactivated user (a failed sign-in of the request's address). Raises
    Locked while the address is locked, and for the failure that locks it."""
    if not AxesProxyHandler.is_allowed(request, TOKEN_CREDENTIALS):
        raise Locked(retry_after(request, TOKEN_CREDENTIALS))
    token = tokens.working(key)
    if token is None:
        user_login_failed.send(sender=__name__, credentials=TOKEN_CREDENTIALS, request=request)
        if request.axes_locked_out:
            raise Locked(retry_after(request, TOKEN_CREDENTIALS))
    return token


def token_user(request, key):
    """The user of working_token(request, key), or None."""
    token = working_token(request, key)
    return token.user if token is not None else None


class TokenAuthentication(authentication.TokenAuthentication):
    """DRF's `Authorization: Token <key>`, checked through working_token: a wrong, expired or
    revoked key is 401, a locked address 429 with Retry-After, and a read-only token 403 on
    anything but GET, HEAD and OPTIONS, whatever the view."""

    def authenticate(self, request):
        parts = authentication.get_authorization_header(request).split()
        if not parts or parts[0].lower() != self.keyword.lower().encode():
            return None
        if len(parts) != 2:
            raise exceptions.AuthenticationFailed("Invalid token header: give one key after 'Token'.")
        try:
            key = parts[1].decode()
        except UnicodeError:
            raise exceptions.AuthenticationFailed("Invalid token header: the key has characters a key never has.")
        try:
            token = working_token(request._request, key)
        except Locked as locked:
            refusal = exceptions.Throttled(detail=message(locked.seconds))   # the message says when
            refusal.wait = locked.seconds                                     # Retry-After
            raise refusal
        if token is None:
            raise exceptions.AuthenticationFailed("Invalid token.")
        if token.read_only and request.method not in permissions.SAFE_METHODS:
            raise exceptions.PermissionDenied("This API token is read-only: it may only read (GET).")
        return token.user, token
