"""Teams from the directory: at every sign-on through an identity provider, the groups its claim
(RINGMASTER_OIDC_GROUPS_CLAIM) names become the user's groups, so group quotas and Kueue queue
mappings follow the directory. Only groups the claim manages (SsoGroup: made, or taken over,
when the claim first names one) are added and removed; a group made by hand in the admin and
never named by the claim keeps the members an admin gives it. The claim naming
RINGMASTER_OIDC_STAFF_GROUP makes the user staff; it no longer naming it takes staff away again,
where the directory gave it (the user was in that managed group)."""
from django.conf import settings
from django.contrib.auth.models import Group
from django.db import transaction

from jobs.models import SsoGroup

NAME_MAX = Group._meta.get_field("name").max_length


def claim_values(claims, claim=None):
    """The group names `claims` (a dict of a provider's claims or attributes) gives under `claim`
    (RINGMASTER_OIDC_GROUPS_CLAIM): a list of strings, or one string; none where it is absent.
    Blank values and names longer than a group's name may be are left out."""
    value = claims.get(claim or settings.RINGMASTER_OIDC_GROUPS_CLAIM) if isinstance(claims, dict) else None
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)):
        return []
    names = []
    for item in value:
        name = item.strip() if isinstance(item, str) else ""
        if name and len(name) <= NAME_MAX and name not in names:
            names.append(name)
    return names


def sync_groups(user, names, staff_group=None):
    """Makes `user`'s managed groups exactly `names` (each made and marked managed where it is not
    yet), leaving the groups the directory does not manage alone; staff as the module says."""
    staff_group = settings.RINGMASTER_OIDC_STAFF_GROUP if staff_group is None else staff_group
    with transaction.atomic():
        wanted = []
        for name in names:
            group, _ = Group.objects.get_or_create(name=name)
            SsoGroup.objects.get_or_create(group=group)
            wanted.append(group)
        had = set(user.groups.filter(sso__isnull=False))
        user.groups.remove(*(had - set(wanted)))
        user.groups.add(*(set(wanted) - had))
        if staff_group:
            if staff_group in names and not user.is_staff:
                user.is_staff = True
                user.save(update_fields=["is_staff"])
            elif staff_group not in names and user.is_staff and any(g.name == staff_group for g in had):
                user.is_staff = False
                user.save(update_fields=["is_staff"])
