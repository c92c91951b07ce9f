"""`fs_write` writes a file's whole content, so running it twice leaves what running it once
does: it is declared idempotent, and recovery may run it again after a lost runner (issue #11).
The native-tool sync only sets flags when it creates a row (admin choices are kept), so rows
made before this change, still at the old flags, are updated here."""

from django.db import migrations


def mark_fs_write_idempotent(apps, schema_editor):
    Tool = apps.get_model("tools_app", "Tool")
    Tool.objects.filter(
        tenant=None, name="fs_write", source="native", read_only=False, idempotent=False
    ).update(idempotent=True)


class Migration(migrations.Migration):
    dependencies = [("tools_app", "0003_disable_unapproved_stdio_servers")]

    operations = [migrations.RunPython(mark_fs_write_idempotent, migrations.RunPython.noop)]
