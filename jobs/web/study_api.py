"""/api/studies/: hyperparameter searches whose trials are jobs (jobs.domain.studies). Another
user's study is 404, as elsewhere."""
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from jobs.domain import studies
from jobs.models import Study, Trial
from jobs.web.api import REFUSED
from jobs.web.parsers import JSONParser
from jobs.web.serializers import DetailSerializer, ErrorsSerializer
from jobs.web.study_forms import StudyForm


class SpaceEntryRequest(serializers.Serializer):
    type = serializers.ChoiceField(choices=studies.TYPES)
    low = serializers.FloatField(required=False)
    high = serializers.FloatField(required=False)
    log = serializers.BooleanField(required=False)
    choices = serializers.ListField(child=serializers.JSONField(), required=False)


class ObjectiveSerializer(serializers.Serializer):
    metric = serializers.CharField(max_length=100)
    direction = serializers.ChoiceField(choices=studies.DIRECTIONS)


class StudyCreateRequest(serializers.Serializer):
    """Documents POST /api/studies/; validation is jobs.web.study_forms.StudyForm."""

    name = serializers.CharField(max_length=100)
    base = serializers.DictField(help_text="A job's fields as POST /api/jobs/ takes them, with {name} "
                                           "placeholders in args and env values.")
    space = serializers.DictField(child=SpaceEntryRequest())
    objective = ObjectiveSerializer()
    trials = serializers.IntegerField(min_value=1, max_value=studies.MAX_TRIALS,
                                      help_text="How many trials are asked for (a failed trial's retry not counted).")
    parallel = serializers.IntegerField(min_value=1, max_value=studies.MAX_TRIALS, required=False,
                                        help_text="Trials at once (default 1), within the quota.")
    sampler = serializers.ChoiceField(choices=studies.SAMPLERS, required=False)
    pruner = serializers.ChoiceField(choices=studies.PRUNERS, required=False)


class TrialSerializer(serializers.Serializer):
    number = serializers.IntegerField()
    params = serializers.DictField()
    state = serializers.ChoiceField(choices=Trial.State.choices)
    value = serializers.FloatField(allow_null=True, help_text="The objective as the trial's job reported it "
                                                               "(while running: its last point).")
    job = serializers.IntegerField(allow_null=True, source="job_id")
    retry_of = serializers.IntegerField(allow_null=True)
    reason = serializers.CharField()


class BestSerializer(serializers.Serializer):
    number = serializers.IntegerField()
    params = serializers.DictField()
    value = serializers.FloatField()
    job = serializers.IntegerField(allow_null=True, source="job_id")


class StudySummarySerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    state = serializers.ChoiceField(choices=Study.State.choices)
    reason = serializers.CharField()
    best = serializers.SerializerMethodField()
    created_at = serializers.DateTimeField()
    finished_at = serializers.DateTimeField(allow_null=True)

    @extend_schema_field(BestSerializer(allow_null=True))
    def get_best(self, study):
        trial = studies.best(study)
        return BestSerializer(trial).data if trial else None


class StudySerializer(StudySummarySerializer):
    spec = serializers.DictField(help_text="The study as submitted, its defaults filled in.")
    trials = serializers.SerializerMethodField()

    @extend_schema_field(TrialSerializer(many=True))
    def get_trials(self, study):
        return TrialSerializer(study.trials.order_by("number"), many=True).data


def get_study(request, study_id):
    return get_object_or_404(studies.visible_studies(request.user), pk=study_id)


class StudyList(APIView):
    parser_classes = [JSONParser]

    @extend_schema(operation_id="studies_list", responses={200: StudySummarySerializer(many=True), **REFUSED})
    def get(self, request):
        return Response(StudySummarySerializer(studies.visible_studies(request.user), many=True).data)

    @extend_schema(request=StudyCreateRequest, responses={201: StudySerializer, 400: ErrorsSerializer, **REFUSED})
    def post(self, request):
        """Start a study: its trials are jobs of the base with the values Optuna picks in its
        placeholders. Refused (400, by field): a placeholder without a space entry or an entry no
        placeholder uses, an empty range, a log range from 0 or below, more trials at once than the
        quota allows, and whatever a trial's job would be refused for (under "base")."""
        form = StudyForm(request.data, user=request.user)
        if not form.is_valid():
            return Response(form.errors, status=status.HTTP_400_BAD_REQUEST)
        study = studies.create(request.user, form.spec)
        return Response(StudySerializer(study).data, status=status.HTTP_201_CREATED)


class StudyDetail(APIView):
    @extend_schema(responses={200: StudySerializer, **REFUSED, 404: DetailSerializer})
    def get(self, request, study_id):
        return Response(StudySerializer(get_study(request, study_id)).data)


class StudyStop(APIView):
    @extend_schema(request=None, responses={200: StudySerializer, **REFUSED, 404: DetailSerializer})
    def post(self, request, study_id):
        """Stop the study: no new trials; its running trials' jobs are cancelled."""
        study = studies.stop(get_study(request, study_id), by=request.user)
        return Response(StudySerializer(study).data)
