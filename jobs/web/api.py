"""REST API under /api/ (contract in DESIGN.md). Another user's job is 404, never 403."""
from django import forms as django_forms
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.parsers import FormParser, MultiPartParser
from rest_framework.response import Response
from rest_framework.views import APIView

from jobs.domain import logquery, quotas, scheduler, services, telemetry
from jobs.domain.services import visible_jobs
from jobs.web.forms import MAX_TAG_CHARS, JobForm, JobNotesForm, ScriptUploadForm, clean_tag, visible_scripts
from jobs.models import Image, MetricPoint, State
from jobs.web import params as params_
from jobs.web.parsers import JSONParser
from jobs.web.serializers import (
    DetailSerializer, ErrorsSerializer, ImageSerializer, JobCreatedSerializer, JobCreateRequest, JobDetailSerializer,
    JobPageSerializer,
    JobSerializer, JobUpdateRequest, LogLineSerializer, LogPageSerializer, MetricsSerializer, QuotaSerializer, ScriptSerializer,
    ScriptUploadRequest, rank_label,
)

MAX_LOG_LIMIT = 10000
MAX_CONTEXT = 20          # lines around a search hit
LOG_LIMITS = (1, MAX_LOG_LIMIT)
CONTEXTS = (0, MAX_CONTEXT)
MAX_CONTEXT_HITS = 200    # hits in one page with context: each may cost two small queries
# Every endpoint: no credentials (401), or credentials that do not work (403).
REFUSED = {401: DetailSerializer, 403: DetailSerializer}


def integer_schema(bounds=params_.BIGINT):
    """An integer query parameter's schema: 64 bits, within the bounds its view reads it in."""
    low, high = bounds
    return {"type": "integer", "format": "int64", "minimum": low, "maximum": high}


def form_errors(form):
    """{"field": ["message", ...]}, with form-wide errors under "non_field_errors"."""
    return {("non_field_errors" if name == "__all__" else name): list(messages)
            for name, messages in form.errors.items()}


def get_job(request, job_id):
    return get_object_or_404(visible_jobs(request.user), pk=job_id)


class ImageList(APIView):
    @extend_schema(responses={200: ImageSerializer(many=True), **REFUSED})
    def get(self, request):
        return Response(ImageSerializer(Image.objects.filter(enabled=True), many=True).data)


class ScriptList(APIView):
    parser_classes = [MultiPartParser, FormParser]

    @extend_schema(responses={200: ScriptSerializer(many=True), **REFUSED})
    def get(self, request):
        return Response(ScriptSerializer(visible_scripts(request.user), many=True).data)

    @extend_schema(request={"multipart/form-data": ScriptUploadRequest},
                   responses={201: ScriptSerializer, 400: ErrorsSerializer, **REFUSED})
    def post(self, request):
        form = ScriptUploadForm(data=request.data, files=request.FILES)
        if not form.is_valid():
            return Response(form_errors(form), status=status.HTTP_400_BAD_REQUEST)
        script = services.store_script(request.user, form.cleaned_data["file"])
        return Response(ScriptSerializer(script).data, status=status.HTTP_201_CREATED)


class JobList(APIView):
    parser_classes = [JSONParser, FormParser, MultiPartParser]

    @extend_schema(operation_id="jobs_list", responses={200: JobPageSerializer, 400: ErrorsSerializer, **REFUSED},
                   parameters=[OpenApiParameter("state", {"type": "string", "enum": State.values},
                                                description="Only jobs in this state (any case)."),
                               OpenApiParameter("tag", {"type": "array", "items": {"type": "string",
                                                                                   "maxLength": MAX_TAG_CHARS}},
                                                style="form", explode=True,
                                                description="Only jobs with this tag; repeated: with every one."),
                               OpenApiParameter("limit", integer_schema(params_.Pagination.limit_bounds),
                                                description="At most this many jobs."),
                               OpenApiParameter("offset", integer_schema(params_.Pagination.offset_bounds),
                                                description="Skip this many first.")])
    def get(self, request):
        jobs = scheduler.with_queue_position(visible_jobs(request.user))
        state = request.query_params.get("state", "").upper()
        if state:
            if state not in State.values:
                return Response({"state": [f"Must be one of {', '.join(State.values)}."]},
                                status=status.HTTP_400_BAD_REQUEST)
            jobs = jobs.filter(state=state)
        try:
            tags = [clean_tag(tag) for tag in request.query_params.getlist("tag") if tag.strip()]
        except django_forms.ValidationError as exc:
            return Response({"tag": exc.messages}, status=status.HTTP_400_BAD_REQUEST)
        if tags:
            jobs = jobs.filter(tags__has_tags=tags)
        if request.query_params.get("mine") and request.user.is_staff:
            jobs = jobs.filter(owner=request.user)
        paginator = params_.Pagination()
        page = paginator.paginate_queryset(jobs, request, view=self)
        return paginator.get_paginated_response(JobSerializer(page, many=True, context={"request": request}).data)

    @extend_schema(request=JobCreateRequest, responses={201: JobCreatedSerializer, 400: ErrorsSerializer, **REFUSED})
    def post(self, request):
        """Submit a job. Its Python (a script, or every .py file of a project) must compile: each
        file and line that does not is a 400 on the field that gave it. `warnings` says what the
        job is created despite (a script written for the other launcher)."""
        if not hasattr(request.data, "get"):
            return Response({"non_field_errors": ["Send a JSON object."]}, status=status.HTTP_400_BAD_REQUEST)
        form = JobForm(data=request.data, user=request.user)
        if not form.is_valid():
            return Response(form_errors(form), status=status.HTTP_400_BAD_REQUEST)
        job = services.submit(request.user, form)
        return Response(JobCreatedSerializer(job, context={"request": request, "warnings": form.warnings}).data,
                        status=status.HTTP_201_CREATED)


class JobDetail(APIView):
    parser_classes = [JSONParser]

    @extend_schema(responses={200: JobDetailSerializer, **REFUSED, 404: DetailSerializer})
    def get(self, request, job_id):
        job = get_job(request, job_id)
        return Response(JobDetailSerializer(job, context={"request": request}).data)

    @extend_schema(request=JobUpdateRequest, responses={200: JobDetailSerializer, 400: ErrorsSerializer, **REFUSED,
                                                        404: DetailSerializer})
    def patch(self, request, job_id):
        """Change the job's tags and/or note; any other field is refused (400, named)."""
        job = get_job(request, job_id)
        if not isinstance(request.data, dict):
            return Response({"non_field_errors": ["Send a JSON object."]}, status=status.HTTP_400_BAD_REQUEST)
        form = JobNotesForm(request.data)
        if not form.is_valid():
            return Response(form_errors(form), status=status.HTTP_400_BAD_REQUEST)
        services.annotate(job, form.changes())
        return Response(JobDetailSerializer(job, context={"request": request}).data)


class JobCancel(APIView):
    @extend_schema(request=None, responses={202: JobSerializer, **REFUSED, 404: DetailSerializer,
                                            409: DetailSerializer})
    def post(self, request, job_id):
        job = get_job(request, job_id)
        try:
            job = services.cancel(job, by=request.user)
        except services.CannotCancel as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
        return Response(JobSerializer(job, context={"request": request}).data, status=status.HTTP_202_ACCEPTED)


class JobLogs(APIView):
    @extend_schema(parameters=[
        OpenApiParameter("since", integer_schema(),
                         description="Return lines with seq greater than this (default: from the start)."),
        OpenApiParameter("before", integer_schema(),
                         description="Return the last `limit` lines with seq less than this "
                                     "(the tail of the log, or the page above a line)."),
        OpenApiParameter("rank", str, description='A rank number, or "launcher".'),
        OpenApiParameter("q", str, description="Only lines containing this text (case-insensitive)."),
        OpenApiParameter("limit", integer_schema(LOG_LIMITS),
                         description=f"At most this many lines (default 1000, max {MAX_LOG_LIMIT}); "
                                     f"with `context`, this many hits (max {MAX_CONTEXT_HITS})."),
        OpenApiParameter("hide_metrics", bool, description="Leave out the `RINGMASTER_METRIC {...}` lines."),
        OpenApiParameter("attempt", integer_schema((1, 2 ** 31 - 1)),
                         description="Only the lines of this attempt (a number of the job's `attempts`)."),
        OpenApiParameter("context", integer_schema(CONTEXTS),
                         description=f"With `q`: also up to this many lines (max {MAX_CONTEXT}) "
                                     "before and after each hit, of the same rank filter, as "
                                     "grep -C; every line then carries `hit`. `next` and "
                                     "`prev` follow the hits."),
    ], responses={200: LogPageSerializer, 400: ErrorsSerializer, **REFUSED, 404: DetailSerializer})
    def get(self, request, job_id):
        """`next` is the seq to pass as `since` for the following page; `prev` the one to pass
        as `before` for the page above."""
        job = get_job(request, job_id)
        params, errors = request.query_params, {}
        since = params_.integer(params, "since", errors, default=-1)
        before = params_.integer(params, "before", errors)
        limit = params_.integer(params, "limit", errors, default=1000, bounds=LOG_LIMITS)
        query = params_.text(params, "q", errors)
        context = params_.integer(params, "context", errors, default=0, bounds=CONTEXTS)
        hide_metrics = params_.boolean(params, "hide_metrics", errors)
        attempt, seqs = params_.integer(params, "attempt", errors, bounds=(1, 2 ** 31 - 1)), None
        if attempt is not None and "attempt" not in errors:
            seqs = logquery.attempt_seqs(job, attempt)
            if seqs is None:
                errors["attempt"] = [f"Job {job.pk} has no attempt {attempt} (its attempts: "
                                     f"{', '.join(map(str, job.attempts.values_list('number', flat=True))) or 'none yet'})."]
        rank = logquery.ALL_RANKS
        try:
            rank = logquery.parse_rank(params.get("rank"))
        except ValueError:
            errors["rank"] = ['Must be a rank number or "launcher".']
        if errors:
            return Response(errors, status=status.HTTP_400_BAD_REQUEST)
        context = context if query else 0
        limit = min(limit, MAX_CONTEXT_HITS) if context else limit
        page = logquery.log_page(job, since=since, before=before, limit=limit, rank=rank, text=query,
                                 hide_metrics=hide_metrics, seqs=seqs)
        shown = page
        if context:
            shown = logquery.with_context(job, page, context, text=query, rank=rank, hide_metrics=hide_metrics)
        return Response({
            "lines": LogLineSerializer(shown, many=True).data,
            "next": page[-1].seq if page else since,
            "prev": page[0].seq if page else (before if before is not None else since + 1),
        })


class JobMetrics(APIView):
    @extend_schema(responses={200: MetricsSerializer, **REFUSED, 404: DetailSerializer})
    def get(self, request, job_id):
        job = get_job(request, job_id)
        series = {}
        for point in MetricPoint.objects.filter(job=job).order_by("name", "step", "id"):
            series.setdefault(point.name, []).append(
                {"rank": rank_label(point.rank), "step": point.step, "value": point.value, "ts": point.ts,
                 "seq": point.seq}
            )
        return Response({"series": series, "system": telemetry.summary(job)})


class QuotaView(APIView):
    """The caller's limits and current use, scope by scope (their own, their groups')."""

    @extend_schema(responses={200: QuotaSerializer, **REFUSED})
    def get(self, request):
        return Response(quotas.summary(request.user))
