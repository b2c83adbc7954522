"""Error pages: JSON under /api/ (what an API client reads), the HTML pages elsewhere."""
from django.http import JsonResponse
from django.views import defaults


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
