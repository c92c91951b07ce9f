"""Skills in Django admin: import (zip upload or pasted SKILL.md), enable/disable, new versions,
export as zip, a sanitized preview of the body and the version history.

Thin: every write goes through `skills_app.packaging` (the one owner of Skills), and package
errors are shown on the form field the package came from, each naming its own field
("archive: entry ../x escapes the skill folder", "name: …"). Scoping is `TenantScopedAdmin`'s:
tenant admins see their tenant's and the global Skills and change only their own.
"""

from __future__ import annotations

from collections import defaultdict

from django import forms
from django.contrib import admin, messages
from django.http import HttpResponse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe

from config.safe_markdown import render_markdown
from tenancy_app.admin import TenantScopedAdmin

from . import packaging
from .choices import SkillSource
from .models import Skill, SkillFile, SkillVersion

PROJECTION_FIELDS = ["name", "tenant", "version", "updated_at"]
FRONTMATTER_FIELDS = ["description", "license", "compatibility", "metadata", "allowed_tools"]


class SourceFilter(admin.SimpleListFilter):
    title = "source"
    parameter_name = "source"

    def lookups(self, request, model_admin):
        return SkillSource.choices

    def queryset(self, request, queryset):
        if self.value() == SkillSource.GLOBAL:
            return queryset.filter(tenant__isnull=True)
        if self.value() == SkillSource.TENANT:
            return queryset.filter(tenant__isnull=False)
        return queryset


class _PackageForm(forms.ModelForm):
    """Reads one package from either the zip field or the pasted-text field into `self.package`."""

    zip_field = "archive"
    text_field = "skill_md"

    def _read_package(self, cleaned) -> None:
        upload, text = cleaned.get(self.zip_field), cleaned.get(self.text_field) or ""
        self.package = None
        if upload and text.strip():
            self.add_error(self.text_field, "Upload a zip or paste a SKILL.md, not both.")
            return
        field = self.zip_field if upload else self.text_field
        try:
            if upload:
                package, self.origin = packaging.read_upload(upload), SkillVersion.Origin.ZIP
            elif text.strip():
                package, self.origin = self._pasted(text), SkillVersion.Origin.PASTE
            else:
                return
            self.check(package)
        except packaging.SkillPackageError as exc:
            for message in exc.messages():
                self.add_error(field, message)
            return
        self.package = package

    def _pasted(self, text: str) -> packaging.SkillPackage:
        return packaging.read_skill_md(text)

    def check(self, package) -> None:
        raise NotImplementedError


class SkillImportForm(_PackageForm):
    archive = forms.FileField(
        required=False,
        label="Zip file",
        help_text="A skill folder zipped: SKILL.md at the root or in one folder named like the skill.",
    )
    skill_md = forms.CharField(
        required=False,
        strip=False,
        label="Or paste a SKILL.md",
        widget=forms.Textarea(attrs={"rows": 18, "cols": 100, "spellcheck": "false"}),
    )

    class Meta:
        model = Skill
        fields = ["tenant"]

    def clean(self):
        cleaned = super().clean()
        if "tenant" in self.errors:
            return cleaned
        self._read_package(cleaned)
        if self.package is None and not self.errors:
            self.add_error(None, "Upload a zip or paste a SKILL.md.")
        return cleaned

    def check(self, package) -> None:
        packaging.check_package(package, tenant=self.cleaned_data.get("tenant"), new=True)


class SkillChangeForm(_PackageForm):
    zip_field = "new_archive"
    text_field = "new_skill_md"
    new_archive = forms.FileField(
        required=False, label="Zip file", help_text="The whole skill, as for an import."
    )
    new_skill_md = forms.CharField(
        required=False,
        strip=False,
        label="Or paste a SKILL.md",
        help_text="Keeps the current version's resource files. The name must stay the same.",
        widget=forms.Textarea(attrs={"rows": 18, "cols": 100, "spellcheck": "false"}),
    )

    class Meta:
        model = Skill
        fields = ["enabled"]

    def clean(self):
        cleaned = super().clean()
        if self.zip_field in self.fields:  # absent when the admin may only read this Skill
            self._read_package(cleaned)
        return cleaned

    def _pasted(self, text):
        return packaging.package_with_skill_md(self.instance, text)

    def check(self, package) -> None:
        packaging.check_package(package, skill=self.instance)


@admin.register(Skill)
class SkillAdmin(TenantScopedAdmin):
    list_display = ["name", "source_label", "enabled", "version", "short_description", "updated_at"]
    list_filter = [SourceFilter, "enabled", ("tenant", admin.RelatedOnlyFieldListFilter)]
    list_select_related = ["tenant"]
    search_fields = ["name", "description", "body"]
    actions = ["export_selected", "enable_selected", "disable_selected"]

    # --- forms ---------------------------------------------------------------------------------

    def get_form(self, request, obj=None, **kwargs):
        kwargs["form"] = SkillImportForm if obj is None else SkillChangeForm
        return super().get_form(request, obj, **kwargs)

    def get_fieldsets(self, request, obj=None):
        if obj is None:
            return [(None, {"fields": ["tenant", "archive", "skill_md"]})]
        fieldsets = [
            (None, {"fields": ["name", "tenant", "enabled", "version", "updated_at"]}),
            ("Frontmatter", {"fields": FRONTMATTER_FIELDS}),
        ]
        if self.has_change_permission(request, obj):
            fieldsets.append(
                (
                    "New version",
                    {
                        "fields": ["new_archive", "new_skill_md"],
                        "description": "Upload or paste a new SKILL.md to add a version; the history is kept.",
                    },
                )
            )
        fieldsets += [("Body", {"fields": ["body_preview"]}), ("Versions", {"fields": ["versions_table"]})]
        return fieldsets

    def get_readonly_fields(self, request, obj=None):
        if obj is None:
            return []
        return [*PROJECTION_FIELDS, *FRONTMATTER_FIELDS, "body_preview", "versions_table"]

    # --- writes, all through packaging ---------------------------------------------------------

    def save_model(self, request, obj, form, change):
        by = request.user.get_username()
        if not change:
            result = packaging.import_package(
                form.package, tenant=form.cleaned_data.get("tenant"), by=by, origin=form.origin
            )
            obj.pk = result.skill.pk
            obj.refresh_from_db()
            self.message_user(request, f"Imported {result.skill.name} (version {result.skill.version}).")
            return
        if "enabled" in form.changed_data:
            packaging.set_enabled(obj, form.cleaned_data["enabled"])
        if getattr(form, "package", None) is not None:
            result = packaging.import_package(form.package, skill=obj, by=by, origin=form.origin)
            if result.changed:
                self.message_user(request, f"Added version {result.version.number} of {obj.name}.")
            else:
                self.message_user(
                    request,
                    "The package is identical to the current version; nothing was added.",
                    messages.WARNING,
                )
        obj.refresh_from_db()

    def save_related(self, request, form, formsets, change):
        pass  # no relations are edited here; versions come from packaging

    def delete_model(self, request, obj):
        packaging.delete_skills([obj])

    def delete_queryset(self, request, queryset):
        packaging.delete_skills(queryset)

    # --- columns and read-only parts -----------------------------------------------------------

    @admin.display(description="source", ordering="tenant__slug")
    def source_label(self, obj):
        return "global" if obj.tenant_id is None else obj.tenant.slug

    @admin.display(description="description")
    def short_description(self, obj):
        text = obj.description
        return text if len(text) <= 80 else text[:79] + "…"

    @admin.display(description="preview")
    def body_preview(self, obj):
        # Sanitized by nh3 with an allow-list: scripts, handlers and raw HTML never pass.
        return mark_safe(f'<div class="skill-body-preview">{render_markdown(obj.body)}</div>')

    @admin.display(description="versions")
    def versions_table(self, obj):
        files = defaultdict(list)
        for file in SkillFile.objects.filter(version__skill=obj).defer("content").order_by("path"):
            files[file.version_id].append(file)
        rows = format_html_join(
            "",
            "<tr><td>{}{}</td><td>{}</td><td>{}</td><td>{}</td><td><code>{}</code></td><td>{}</td></tr>",
            (
                (
                    version.number,
                    " (current)" if version.pk == obj.current_version_id else "",
                    version.get_origin_display(),
                    version.created_by or "—",
                    version.created_at.strftime("%Y-%m-%d %H:%M:%S UTC"),
                    version.sha256,
                    format_html_join(
                        "<br>",
                        "{}{} ({} bytes)",
                        ((f.path, " *" if f.executable else "", f.size) for f in files[version.pk]),
                    )
                    or "SKILL.md only",
                )
                for version in obj.versions.defer("skill_md").order_by("-number")
            ),
        )
        return format_html(
            '<table class="skill-versions"><thead><tr><th>#</th><th>origin</th><th>by</th><th>created</th>'
            "<th>sha256</th><th>files (* executable)</th></tr></thead><tbody>{}</tbody></table>",
            rows,
        )

    # --- actions -------------------------------------------------------------------------------

    @admin.action(description="Export selected as zip")
    def export_selected(self, request, queryset):
        skills = list(queryset)
        if not skills:
            # Ids this admin cannot see select nothing (the queryset is tenant-scoped).
            self.message_user(request, "None of the selected Skills can be exported.", messages.WARNING)
            return None
        try:
            data = packaging.export_zip_many(skills)
        except packaging.SkillPackageError as exc:
            self.message_user(request, str(exc), messages.ERROR)
            return None
        filename = f"{skills[0].name}.zip" if len(skills) == 1 else "skills.zip"
        response = HttpResponse(data, content_type="application/zip")
        response["Content-Disposition"] = f'attachment; filename="{filename}"'
        return response

    @admin.action(description="Enable selected Skills", permissions=["change"])
    def enable_selected(self, request, queryset):
        self._switch(request, queryset, True)

    @admin.action(description="Disable selected Skills", permissions=["change"])
    def disable_selected(self, request, queryset):
        self._switch(request, queryset, False)

    def _switch(self, request, queryset, enabled: bool) -> None:
        changed = skipped = 0
        for skill in queryset:
            if not self.has_change_permission(request, skill):
                skipped += 1  # a global Skill, for a tenant admin
                continue
            changed += packaging.set_enabled(skill, enabled)
        word = "Enabled" if enabled else "Disabled"
        self.message_user(request, f"{word} {changed} Skill(s).")
        if skipped:
            self.message_user(
                request,
                f"{skipped} global Skill(s) left as they are: only an operator changes them.",
                messages.WARNING,
            )
