"""`field__anyof=values`: the rows whose field is one of `values` (plain values of the field's type).

The same rows as `__in`, with one parameter on PostgreSQL (`field = ANY(%s)`, the list sent as an
array) instead of one prepared per value: a worker's heartbeat and its followers' group writer
name every job the worker follows, and with 1,000 of them Django's per-value preparation of `__in`
takes a tenth of the worker's interpreter time. Elsewhere (SQLite) it is `IN (%s, ...)`.

`jsonfield__has_tags=[...]`: the rows whose JSON list holds every string named (a job's tags), on
both databases.
"""
import json

from django.db.models import Field, JSONField, Lookup

from jobs.database import on_postgresql


@Field.register_lookup
class AnyOf(Lookup):
    lookup_name = "anyof"
    prepare_rhs = False

    def as_sql(self, compiler, connection):
        lhs, lhs_params = self.process_lhs(compiler, connection)
        values = list(self.rhs)
        if on_postgresql():
            return f"{lhs} = ANY(%s)", (*lhs_params, values)
        if not values:
            return "1 = 0", ()
        return f"{lhs} IN ({', '.join(['%s'] * len(values))})", (*lhs_params, *values)


@JSONField.register_lookup
class HasTags(Lookup):
    """`tags__has_tags=["a", "b"]`: the rows whose JSON list holds every one of the strings.

    PostgreSQL: `tags @> '["a", "b"]'`, which the GIN index of migration 0018 serves. SQLite (the
    embedded default) has no containment operator: one `EXISTS` over json_each() per string."""

    lookup_name = "has_tags"
    prepare_rhs = False

    def as_sql(self, compiler, connection):
        lhs, lhs_params = self.process_lhs(compiler, connection)
        wanted = list(self.rhs)
        if not wanted:
            return "1 = 1", ()
        if connection.vendor == "postgresql":
            return f"{lhs} @> %s::jsonb", (*lhs_params, json.dumps(wanted))
        each = f"EXISTS (SELECT 1 FROM json_each({lhs}) WHERE json_each.value = %s)"
        return " AND ".join([each] * len(wanted)), tuple(part for tag in wanted for part in (*lhs_params, tag))
