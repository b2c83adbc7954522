from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('jobs', '0024_api_token_digest'),
    ]

    operations = [
        migrations.AddField(
            model_name='image',
            name='extra_packages',
            field=models.BooleanField(default=True, help_text="Whether a project's requirements.txt (or pyproject.toml dependencies) is installed on top of this image. Off: a project that names packages is refused with this image."),
        ),
    ]
