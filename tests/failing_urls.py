"""The portal's URLs and error handlers (portal.urls), with a view that fails unexpectedly under
/api/ and on a page: how an error nobody foresaw reaches a client (tests/test_api_input.py)."""
from django.urls import path
from rest_framework.decorators import api_view

from portal.urls import handler400, handler404, handler500, urlpatterns as portal_urlpatterns  # noqa: F401

SECRET = "the database password is hunter2"


def fail(request):
    raise RuntimeError(SECRET)


urlpatterns = [
    path("api/failing/", api_view(["GET"])(fail)),
    path("failing/", fail),
    *portal_urlpatterns,
]
