from allauth.account import views as account_views
from allauth.socialaccount import views as social_views
from allauth.urls import build_provider_urlpatterns
from csp.decorators import csp_update
from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path
from django.views.generic import RedirectView
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from jobs.web import sso

urlpatterns = [
    path("admin/", admin.site.urls),
    path("login/", sso.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    # Single sign-on (django-allauth): the providers' login and callback, and the few pages of
    # its flow; no sign-up, password or e-mail pages of its own (/login/ is the one login page).
    path("accounts/", include([
        path("login/", RedirectView.as_view(pattern_name="login", query_string=True), name="account_login"),
        path("inactive/", account_views.account_inactive, name="account_inactive"),
        path("3rdparty/login/cancelled/", social_views.login_cancelled, name="socialaccount_login_cancelled"),
        path("3rdparty/login/error/", social_views.login_error, name="socialaccount_login_error"),
        path("3rdparty/signup/", social_views.signup, name="socialaccount_signup"),
        *build_provider_urlpatterns(),
    ])),
    # The API's description, open to anyone who reaches the portal: it holds no data.
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    # Swagger UI's script is a file of its own (the split view serves it at ?script), so the page
    # needs no inline script; it does carry an inline <style>, the one inline style the CSP allows.
    path("api/docs/", csp_update({"style-src": ["'unsafe-inline'"]})(
        SpectacularSwaggerSplitView.as_view(url_name="api-schema")), name="api-docs"),
    path("api/", include("jobs.web.api_urls")),
    path("", include("jobs.web.urls")),
]

handler404 = "jobs.web.errors.not_found"
handler400 = "jobs.web.errors.bad_request"
handler500 = "jobs.web.errors.server_error"
