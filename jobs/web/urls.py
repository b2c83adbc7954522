from django.templatetags.static import static
from django.urls import path
from django.views.generic import RedirectView

from jobs.web import artifact_views, compare_views, joblist, settings_views, study_views, usage_views, views
from jobs.web import params  # noqa: F401  (the <id:...> converter)

urlpatterns = [
    path("", joblist.job_list, name="job-list"),
    path("jobs/", RedirectView.as_view(pattern_name="job-list", query_string=True)),
    path("favicon.ico", RedirectView.as_view(url=static("ringmaster/favicon.svg"), permanent=True)),
    path("jobs/new/", views.job_new, name="job-new"),
    path("jobs/<id:job_id>/", views.job_detail, name="job-detail"),
    path("jobs/<id:job_id>/mpijob/", views.job_mpijob, name="job-mpijob"),
    path("jobs/<id:job_id>/log/", views.job_log_download, name="job-log-download"),
    path("jobs/<id:job_id>/cancel/", views.job_cancel, name="job-cancel"),
    path("jobs/<id:job_id>/rerun/", views.job_rerun, name="job-rerun"),
    path("jobs/<id:job_id>/notes/", views.job_notes, name="job-notes"),
    path("jobs/<id:job_id>/files/<path:path>", views.job_file, name="job-file"),
    path("jobs/<id:job_id>/artifacts.tar.gz", artifact_views.artifact_archive, name="job-artifact-archive"),
    path("jobs/<id:job_id>/artifacts/fetch/", artifact_views.artifact_fetch, name="job-artifact-fetch"),
    path("jobs/<id:job_id>/artifacts/<path:name>", artifact_views.artifact_file, name="job-artifact"),
    path("jobs/<id:job_id>/rerun-from-checkpoint/", artifact_views.rerun_from_checkpoint,
         name="job-rerun-from-checkpoint"),
    path("compare/", compare_views.compare_page, name="compare"),
    path("studies/", study_views.study_list, name="study-list"),
    path("studies/<id:study_id>/", study_views.study_detail, name="study-detail"),
    path("studies/<id:study_id>/stop/", study_views.study_stop, name="study-stop"),
    path("usage/", usage_views.my_usage, name="my-usage"),
    path("settings/", settings_views.settings_page, name="settings"),
    path("settings/notifications/<id:target_id>/", settings_views.target_log, name="notification-target"),
    path("settings/notifications/<id:target_id>/test/", settings_views.target_test, name="notification-target-test"),
    path("settings/notifications/<id:target_id>/delete/", settings_views.target_delete,
         name="notification-target-delete"),
    path("usage.csv", usage_views.usage_csv, name="usage-csv"),
    path("capacity/", usage_views.capacity, name="capacity"),
    path("cluster/", RedirectView.as_view(pattern_name="capacity", query_string=True, permanent=True)),
]
