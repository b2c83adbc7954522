from csp.decorators import csp_update
from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

urlpatterns = [
    path("admin/", admin.site.urls),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
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
