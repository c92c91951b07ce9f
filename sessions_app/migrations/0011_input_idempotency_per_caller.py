"""An Idempotency-Key is unique per Session and caller (the API key, else the user), no longer per
Session alone: a colleague reusing a key string got the first caller's input back and theirs was
dropped (issue #25). Inputs recorded before keep an empty caller."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("sessions_app", "0010_inputrequest"),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name="input",
            name="unique_input_idempotency_key",
        ),
        migrations.AddField(
            model_name="input",
            name="caller",
            field=models.CharField(blank=True, default="", max_length=50),
        ),
        migrations.AddConstraint(
            model_name="input",
            constraint=models.UniqueConstraint(
                fields=("session", "caller", "idempotency_key"),
                name="unique_input_idempotency_key_per_caller",
            ),
        ),
    ]
