"""The compare page (/compare/?jobs=…) and GET /api/compare/?jobs=…: 2 to 10 of the caller's
jobs side by side (jobs.domain.compare). A job the caller may not see is 404, as elsewhere."""
from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import render
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from jobs.domain.compare import CompareError, comparison, parse_ids
from jobs.domain.services import visible_jobs
from jobs.web.api import REFUSED
from jobs.web.serializers import DetailSerializer


def compared_jobs(user, text):
    """The jobs of `jobs=…` that `user` may see, in the order given; CompareError for a bad
    list, Http404 where one of them is not the user's to see."""
    ids = parse_ids(text)
    found = {job.pk: job for job in visible_jobs(user).filter(pk__in=ids).select_related("image", "script", "project")}
    missing = [pk for pk in ids if pk not in found]
    if missing:
        raise Http404(f"No job {missing[0]}.")
    return [found[pk] for pk in ids]


class CompareView(APIView):
    @extend_schema(
        parameters=[OpenApiParameter("jobs", str, required=True, description="2 to 10 job ids, comma-separated")],
        responses={200: inline_serializer("Comparison", {
            "jobs": serializers.ListField(child=serializers.DictField()),
            "fields": serializers.ListField(child=serializers.CharField()),
            "differs": serializers.ListField(child=serializers.CharField()),
            "script_diffs": serializers.ListField(child=serializers.DictField()),
            "series": serializers.DictField()}),
            400: inline_serializer("CompareErrors", {"jobs": serializers.ListField(child=serializers.CharField())}),
            **REFUSED, 404: DetailSerializer})
    def get(self, request):
        try:
            jobs = compared_jobs(request.user, request.query_params.get("jobs", ""))
        except CompareError as error:
            return Response({"jobs": [str(error)]}, status=status.HTTP_400_BAD_REQUEST)
        return Response(comparison(jobs))


@login_required
def compare_page(request):
    try:
        jobs = compared_jobs(request.user, ",".join(request.GET.getlist("jobs")))   # the list's ticks: jobs=1&jobs=2
    except CompareError as error:
        return render(request, "jobs/compare.html", {"error": str(error)}, status=400)
    data = comparison(jobs)
    rows = [{"name": name, "values": [job["fields"][name] for job in data["jobs"]], "differs": name in data["differs"]}
            for name in data["fields"]]
    metrics = sorted({name for job in data["jobs"] for name in job["metrics"]})
    return render(request, "jobs/compare.html", {
        "data": data, "jobs": jobs, "rows": rows, "metrics": metrics,
        "metric_rows": [{"name": name, "cells": [job["metrics"].get(name) for job in data["jobs"]]} for name in metrics],
        "labels": {str(job.pk): f"#{job.pk} {job.display_name}" for job in jobs},
    })
