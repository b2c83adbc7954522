"""Error pages: JSON under /api/ (what an API client reads), the HTML pages elsewhere."""
from django.http import JsonResponse
from django.views import defaults

# RFC 9457: "about:blank" says the status code is the whole story, and its title is the status's.
SERVER_ERROR_PROBLEM = {
    "type": "about:blank",
    "title": "Internal Server Error",
    "status": 500,
    "detail": "The server met an unexpected error; it has been logged.",
}


def _api(request):
    return request.path.startswith("/api/")


def not_found(request, exception=None):
    if _api(request):
        return JsonResponse({"detail": "Not found."}, status=404)
    return defaults.page_not_found(request, exception)


def bad_request(request, exception=None):
    """Django's own refusals before a view runs (a body too large, too many fields or files)."""
    if _api(request):
        return JsonResponse({"detail": f"Bad request: {exception}" if exception else "Bad request."}, status=400)
    return defaults.bad_request(request, exception)


def server_error(request):
    """An exception no view handled, which Django logs with its traceback: the answer names
    neither, so nothing of the portal's insides reaches the client."""
    if _api(request):
        return JsonResponse(SERVER_ERROR_PROBLEM, status=500, content_type="application/problem+json")
    return defaults.server_error(request)
