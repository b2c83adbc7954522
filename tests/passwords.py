"""The tests' password hasher: Django's PBKDF2 with one iteration.

Django's default (a million iterations) spends about a second of CPU on each test user made; the
suite makes hundreds. A hash made here keeps the algorithm's name, so the portal's own processes
(uvicorn, the worker) verify it with their default hashers, by the count the hash records.
"""
from django.contrib.auth.hashers import PBKDF2PasswordHasher


class OneIterationPBKDF2(PBKDF2PasswordHasher):
    iterations = 1
