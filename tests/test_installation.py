"""Each installation has an id, kept with its data, in every name it gives outside its database."""
import pytest
from django.core.exceptions import ImproperlyConfigured

from jobs.backends import job_spec
from jobs.installation import installation_id
from jobs.models import Installation, Job


def test_the_id_is_made_with_the_database_and_stays(db):
    first = installation_id()
    assert Installation.objects.get().ident == first and len(first) == 8
    assert installation_id() == first


def test_a_reset_database_is_a_new_installation(db):
    before = installation_id()
    Installation.objects.all().delete()                    # as a fresh database would be
    after = installation_id()
    assert after != before and Installation.objects.get().ident == after


def test_the_setting_overrides_it_and_is_checked(db, settings):
    settings.RINGMASTER_INSTALLATION_ID = "staging2"
    assert installation_id() == "staging2"
    settings.RINGMASTER_INSTALLATION_ID = "Staging 2"
    with pytest.raises(ImproperlyConfigured, match="RINGMASTER_INSTALLATION_ID"):
        installation_id()


def test_a_jobs_name_outside_the_database_carries_the_id(db, make_user, image, settings):
    settings.RINGMASTER_INSTALLATION_ID = "prod1"
    job = Job.objects.create(owner=make_user("alice"), image=image, gpus=1, script_path="t.py",
                             time_limit_minutes=5)
    spec = job_spec(job)
    assert spec.installation == "prod1" and spec.name == f"rm-prod1-{job.pk}"
