"""A phone's screen, 390 x 844 in headless Chromium: the navigation fits and reads ("Log out" on
the dark bar, not white on the white page), and no page scrolls sideways: the job list, the job
page with its charts, the job form, usage."""
import pytest

from tests.browser.conftest import expect, wait_for_page
from tests.browser.test_live_job_page import job, store  # noqa: F401 (a fixture)

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.django_db(transaction=True)]

PHONE = {"width": 390, "height": 844}

# WCAG's contrast ratio of the text's colour and the colour actually behind it (the first
# ancestor with a background), and whether the element lies inside that ancestor's box.
CONTRAST = """el => {
    const rgb = (c) => c.match(/[\\d.]+/g).map(Number);
    const lum = ([r, g, b]) => {
        const f = (v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; };
        return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b);
    };
    let back = el;
    while (back && rgb(getComputedStyle(back).backgroundColor).length === 4 &&
           rgb(getComputedStyle(back).backgroundColor)[3] === 0) back = back.parentElement;
    const bg = back ? rgb(getComputedStyle(back).backgroundColor) : [255, 255, 255];
    const [a, b] = [lum(rgb(getComputedStyle(el).color)), lum(bg)].sort((x, y) => y - x);
    const box = el.getBoundingClientRect(), around = (back || document.body).getBoundingClientRect();
    const inside = box.left >= around.left && box.right <= around.right &&
                   box.top >= around.top && box.bottom <= around.bottom;
    return {ratio: (a + 0.05) / (b + 0.05), inside, right: box.right};
}"""


def fits(page):
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= PHONE["width"], f"{page.url} is {width} px wide"


def test_every_page_fits_a_phone_and_log_out_reads(log_in, alice, make_user, job):  # noqa: F811
    metric = 'RINGMASTER_METRIC {{"step": {step}, "loss": {loss}, "img_per_sec": {ips}}}'
    store(job, [(rank, metric.format(step=s, loss=1.0 / (s + 1), ips=800 + s)) for s in range(20) for rank in (0, 1)])
    job.reason = "a reason long enough to need wrapping on a phone: " + "word " * 40
    job.save(update_fields=["reason"])
    staff = make_user("root", is_staff=True)          # the widest navigation: Cluster and Admin too

    for user in (alice, staff):
        page = log_in(user, viewport=PHONE)
        log_out = page.locator("header.top nav button", has_text="Log out")
        expect(log_out).to_be_visible()
        seen = log_out.evaluate(CONTRAST)
        assert seen["inside"] and seen["ratio"] >= 4.5 and seen["right"] <= PHONE["width"], seen
        for url in ("/", "/jobs/new/", "/usage/", f"/jobs/{job.pk}/"):
            page.goto(url)
            expect(page.locator("main h1")).to_be_visible()
            fits(page)
        if user.is_staff:
            page.goto("/capacity/")
            fits(page)

    # The job page's charts: as wide as their card, not 520 px.
    page.goto(f"/jobs/{job.pk}/")
    chart = page.locator('#charts .chart[data-metric="loss"]')
    expect(chart).to_have_attribute("data-points", "40")
    expect(chart.locator("canvas")).to_have_count(1)
    card = page.locator("#charts-card").bounding_box()
    for box in page.locator("#charts .chart .uplot").all():
        drawn = box.bounding_box()
        assert drawn["x"] >= card["x"] and drawn["x"] + drawn["width"] <= card["x"] + card["width"], (drawn, card)
    fits(page)

    # Turned sideways, the charts grow with their card.
    page.set_viewport_size({"width": 844, "height": 390})
    wait_for_page(page, """() => {
        const card = document.getElementById('charts').getBoundingClientRect().width;
        const plot = document.querySelector('#charts .chart .uplot').getBoundingClientRect().width;
        return plot > 500 && plot <= card;
    }""", timeout=10)
