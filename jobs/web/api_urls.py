from django.urls import path

from jobs.web import (api, artifact_api, backend_api, compare_views, git_api, notify_api, project_api,
                      study_api)
from jobs.web import params  # noqa: F401  (the <id:...> converter)

urlpatterns = [
    path("images/", api.ImageList.as_view(), name="api-images"),
    path("scripts/", api.ScriptList.as_view(), name="api-scripts"),
    path("projects/", project_api.ProjectList.as_view(), name="api-projects"),
    path("git-credentials/", git_api.GitCredentialList.as_view(), name="api-git-credentials"),
    path("git-credentials/<id:credential_id>/", git_api.GitCredentialDetail.as_view(), name="api-git-credential"),
    path("jobs/", api.JobList.as_view(), name="api-jobs"),
    path("jobs/<id:job_id>/", api.JobDetail.as_view(), name="api-job"),
    path("jobs/<id:job_id>/cancel/", api.JobCancel.as_view(), name="api-job-cancel"),
    path("jobs/<id:job_id>/logs/", api.JobLogs.as_view(), name="api-job-logs"),
    path("jobs/<id:job_id>/metrics/", api.JobMetrics.as_view(), name="api-job-metrics"),
    path("jobs/<id:job_id>/artifacts/", artifact_api.ArtifactList.as_view(), name="api-job-artifacts"),
    path("jobs/<id:job_id>/artifacts.tar.gz", artifact_api.ArtifactArchive.as_view(), name="api-job-artifact-archive"),
    path("jobs/<id:job_id>/artifacts/fetch/", artifact_api.ArtifactFetch.as_view(), name="api-job-artifact-fetch"),
    path("jobs/<id:job_id>/artifacts/<path:name>", artifact_api.ArtifactFile.as_view(), name="api-job-artifact"),
    path("jobs/<id:job_id>/files/", project_api.JobFiles.as_view(), name="api-job-files"),
    path("jobs/<id:job_id>/files/<path:path>", project_api.JobFile.as_view(), name="api-job-file"),
    path("jobs/<id:job_id>/rerun-from-checkpoint/", artifact_api.RerunFromCheckpoint.as_view(),
         name="api-job-rerun-from-checkpoint"),
    path("studies/", study_api.StudyList.as_view(), name="api-studies"),
    path("studies/<id:study_id>/", study_api.StudyDetail.as_view(), name="api-study"),
    path("studies/<id:study_id>/stop/", study_api.StudyStop.as_view(), name="api-study-stop"),
    path("quota/", api.QuotaView.as_view(), name="api-quota"),
    path("backends/", backend_api.BackendList.as_view(), name="api-backends"),
    path("compare/", compare_views.CompareView.as_view(), name="api-compare"),
    path("notifications/", notify_api.NotificationSettings.as_view(), name="api-notifications"),
    path("notifications/targets/", notify_api.TargetList.as_view(), name="api-notification-targets"),
    path("notifications/targets/<id:target_id>/", notify_api.TargetDetail.as_view(), name="api-notification-target"),
    path("notifications/targets/<id:target_id>/test/", notify_api.TargetTest.as_view(),
         name="api-notification-target-test"),
    path("notifications/targets/<id:target_id>/deliveries/", notify_api.TargetDeliveries.as_view(),
         name="api-notification-target-deliveries"),
]
