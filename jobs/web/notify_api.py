"""/api/notifications/: the caller's notification preferences and targets, as the settings page
manages them (the same forms: jobs.web.notify_forms). A target's address is shown masked, as the
page shows it; a webhook secret the portal made is in the answer that creates the target only.
Another user's target is 404, whoever asks."""
from django.forms.models import model_to_dict
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_field
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from jobs.domain import notifications
from jobs.models import NotificationDelivery, NotificationPreferences, NotificationTarget
from jobs.web import params as params_
from jobs.web.api import REFUSED, form_errors, integer_schema
from jobs.web.notify_forms import PreferencesForm, TargetForm
from jobs.web.parsers import JSONParser
from jobs.web.serializers import DetailSerializer, ErrorsSerializer

PREFERENCES = PreferencesForm.Meta.fields
SWITCHES = [name for name in PREFERENCES if name.startswith("on_")]


class PreferencesSerializer(serializers.ModelSerializer):
    class Meta:
        model = NotificationPreferences
        fields = PREFERENCES


class DeliverySerializer(serializers.ModelSerializer):
    job = serializers.IntegerField(source="job_id", allow_null=True, help_text="The job it was about (none: a test).")

    class Meta:
        model = NotificationDelivery
        fields = ["id", "event", "job", "status", "attempts", "detail", "created_at", "updated_at"]


class TargetSerializer(serializers.ModelSerializer):
    address = serializers.CharField(source="shown", help_text="Masked, as the settings page shows it; the "
                                                              "address itself is stored encrypted and never sent back.")
    last_delivery = serializers.SerializerMethodField()

    class Meta:
        model = NotificationTarget
        fields = ["id", "kind", "name", "address", "created_at", "last_delivery"]

    @extend_schema_field(DeliverySerializer(allow_null=True))
    def get_last_delivery(self, target):
        last = self.context.get("last", {}).get(target.pk)
        return DeliverySerializer(last).data if last is not None else None


class CreatedTargetSerializer(TargetSerializer):
    secret = serializers.CharField(required=False, help_text="A webhook's HMAC-SHA256 key, where the portal made "
                                                             "it (none was given): in this answer only.")

    class Meta(TargetSerializer.Meta):
        fields = [*TargetSerializer.Meta.fields, "secret"]


class TargetCreateRequest(serializers.Serializer):
    """The settings page's "Add a target" fields (TargetForm)."""
    kind = serializers.ChoiceField(choices=NotificationTarget.Kind.choices)
    name = serializers.CharField(max_length=100, required=False)
    address = serializers.CharField(max_length=2000, help_text=TargetForm.base_fields["address"].help_text)
    secret = serializers.CharField(max_length=200, required=False, help_text=TargetForm.base_fields["secret"].help_text)


class NotificationsSerializer(serializers.Serializer):
    preferences = PreferencesSerializer()
    targets = TargetSerializer(many=True)


class DeliveryPageSerializer(serializers.Serializer):
    count = serializers.IntegerField()
    next = serializers.URLField(allow_null=True)
    previous = serializers.URLField(allow_null=True)
    results = DeliverySerializer(many=True)


def not_an_object():
    return Response({"non_field_errors": ["Send a JSON object."]}, status=status.HTTP_400_BAD_REQUEST)


def unknown_fields(data, known):
    """{"name": ["message"]} for each field of `data` outside `known`."""
    return {str(name): [f"Not a field here: one of {', '.join(known)}."] for name in data if name not in known}


def targets_data(user):
    targets = NotificationTarget.objects.filter(owner=user).order_by("id")
    return TargetSerializer(targets, many=True, context={"last": notifications.last_deliveries(targets)}).data


def own_target(request, target_id):
    return get_object_or_404(NotificationTarget, pk=target_id, owner=request.user)


class NotificationSettings(APIView):
    parser_classes = [JSONParser]

    @extend_schema(responses={200: NotificationsSerializer, **REFUSED})
    def get(self, request):
        """Which events reach your targets, and the targets."""
        prefs = notifications.preferences(request.user.pk)
        return Response({"preferences": PreferencesSerializer(prefs).data, "targets": targets_data(request.user)})

    @extend_schema(request=PreferencesSerializer(partial=True),
                   responses={200: NotificationsSerializer, 400: ErrorsSerializer, **REFUSED})
    def patch(self, request):
        """Change the preferences named; the others keep their values."""
        if not isinstance(request.data, dict):
            return not_an_object()
        errors = unknown_fields(request.data, PREFERENCES)
        errors.update({name: ["Must be true or false."] for name in SWITCHES
                       if name in request.data and not isinstance(request.data[name], bool)})
        prefs = notifications.preferences(request.user.pk)
        form = PreferencesForm(data={**model_to_dict(prefs, fields=PREFERENCES), **request.data}, instance=prefs)
        if errors or not form.is_valid():
            return Response({**form_errors(form), **errors}, status=status.HTTP_400_BAD_REQUEST)
        form.save()
        return self.get(request)


class TargetList(APIView):
    parser_classes = [JSONParser]

    @extend_schema(responses={200: TargetSerializer(many=True), **REFUSED})
    def get(self, request):
        return Response(targets_data(request.user))

    @extend_schema(request=TargetCreateRequest,
                   responses={201: CreatedTargetSerializer, 400: ErrorsSerializer, **REFUSED})
    def post(self, request):
        """Add a target, checked as the settings page checks it (where it points included)."""
        if not isinstance(request.data, dict):
            return not_an_object()
        errors = unknown_fields(request.data, list(TargetForm.base_fields))
        form = TargetForm(data=request.data)
        if errors or not form.is_valid():
            return Response({**form_errors(form), **errors}, status=status.HTTP_400_BAD_REQUEST)
        target, made = form.save(request.user)
        data = TargetSerializer(target).data
        if made:
            data["secret"] = made
        return Response(data, status=status.HTTP_201_CREATED)


class TargetDetail(APIView):
    @extend_schema(responses={200: TargetSerializer, **REFUSED, 404: DetailSerializer})
    def get(self, request, target_id):
        target = own_target(request, target_id)
        last = notifications.last_deliveries(NotificationTarget.objects.filter(pk=target.pk))
        return Response(TargetSerializer(target, context={"last": last}).data)

    @extend_schema(responses={204: None, **REFUSED, 404: DetailSerializer})
    def delete(self, request, target_id):
        own_target(request, target_id).delete()
        return Response(status=status.HTTP_204_NO_CONTENT)


class TargetTest(APIView):
    @extend_schema(request=None, responses={200: DeliverySerializer, **REFUSED, 404: DetailSerializer})
    def post(self, request, target_id):
        """Send a test message now (one attempt, as the settings page's Send test); the delivery
        says how it went (`status` delivered or failed, `detail` why)."""
        return Response(DeliverySerializer(notifications.send_test(own_target(request, target_id))).data)


class TargetDeliveries(APIView):
    @extend_schema(responses={200: DeliveryPageSerializer, 400: ErrorsSerializer, **REFUSED, 404: DetailSerializer},
                   parameters=[OpenApiParameter("limit", integer_schema(params_.Pagination.limit_bounds),
                                                description="At most this many deliveries."),
                               OpenApiParameter("offset", integer_schema(params_.Pagination.offset_bounds),
                                                description="Skip this many first.")])
    def get(self, request, target_id):
        """The target's delivery log, newest first."""
        deliveries = own_target(request, target_id).deliveries.order_by("-id")
        paginator = params_.Pagination()
        page = paginator.paginate_queryset(deliveries, request, view=self)
        return paginator.get_paginated_response(DeliverySerializer(page, many=True).data)
