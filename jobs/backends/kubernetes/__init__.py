"""The kubernetes backend (enabled as jobs.backends.kubernetes.backend.KubernetesBackend): jobs as
MPIJobs or TrainJobs on registered clusters, queued by Kueue where a cluster runs it.

Its folder holds all that is its own: the backend (backend.py), the clusters' settings and
connections (clusters.py), its models, migrations and admin, the admin's forms (forms.py), its
management commands (add_cluster, map_queue, render_mpijob, render_trainjob) and its capacity
table. portal.settings installs the package as a Django app while the backend is enabled.
The Backend class is not imported here: Django imports an app's package before its models are
ready.
"""
