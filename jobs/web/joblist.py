"""The job list page: everyone's own jobs (staff: every job), filtered, searched and sorted as
the query string says (jobs.web.job_filters), 25 to a page; with ?live=1 only its rows and
pager, which the page fetches every few seconds to stay current (frontend/.../joblist.js)."""
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.shortcuts import render
from django.utils import timezone

from jobs.domain.services import visible_jobs
from jobs.web.job_filters import JobFilterForm, run_time, short_duration

PAGE_SIZE = 25


@login_required
def job_list(request):
    filters = JobFilterForm(request.GET, user=request.user)
    jobs = filters.filter(visible_jobs(request.user), request.user)
    # Two steps: the page's ids from an index alone, then only those rows with their joins, so a
    # deep page does not join every row it skips. Same queries on every page and every filter.
    page = Paginator(jobs.values_list("pk", flat=True), PAGE_SIZE).get_page(request.GET.get("page"))
    ids = list(page.object_list)
    rows = jobs.in_bulk(ids)
    now = timezone.now()
    for job in rows.values():
        job.run_time = short_duration(run_time(job, now))
        job.tag_links = [(tag, filters.with_tag(tag)) for tag in job.tags]
    context = {"page": page, "jobs": [rows[pk] for pk in ids], "filters": filters,
               "columns": filters.column_links(), "page_query": _then(filters.query())}
    template = "jobs/_job_list_live.html" if request.GET.get("live") else "jobs/job_list.html"
    return render(request, template, context)


def _then(query):
    """ "?a=1" -> "?a=1&", "?" -> "?": what a page number is appended to."""
    return query if query == "?" else query + "&"
