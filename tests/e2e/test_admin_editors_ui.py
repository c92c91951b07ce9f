"""Admin editors a tenant admin uses in Chromium (issue #27): an approval policy's rules are
plain fields that fit the page (no 2,600 px table, no raw JSON unless asked for), and saving a
condition row and a decider choice stores them."""

from .test_workspace import expect, log_in

VIEWPORT_WIDTH = 1360


def open_first_policy(page):
    page.goto("/admin/approvals_app/approvalpolicy/")
    page.locator("#result_list tbody tr th a").first.click()
    expect(page.locator("[data-testid=condition-rows]").first).to_be_visible()


def test_approval_rules_are_edited_in_fields_that_fit_the_page(page, tmp_path):
    log_in(page)
    open_first_policy(page)
    page.screenshot(path=str(tmp_path / "rules.png"), full_page=True)

    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= VIEWPORT_WIDTH, f"the rules editor is {width}px wide"
    # The JSON is there, but closed: an "advanced" view.
    advanced = page.locator("details.rule-advanced").first
    expect(advanced).not_to_have_attribute("open", "")
    expect(advanced.locator("textarea")).to_be_hidden()

    # The last rule block is the empty one Django offers for a new rule.
    rule = page.locator(".inline-related:not(.empty-form)").last
    rule.locator("input[name$='-tool_glob']").fill("fs_delete_files")
    rule.locator("input[name$='__path_0']").fill("paths[*]")
    rule.locator("input[name$='__regex_0']").fill("^keep/")
    rule.locator("input[name$='__negate_0']").check()
    rule.locator("input[name$='deciders__session_owner']").uncheck()
    rule.locator("input[name$='deciders__role_member']").check()
    rule.locator("select[name$='-action']").select_option("require_approval")
    page.locator("input[name=_continue]").click()

    expect(page.locator(".messagelist .success")).to_be_visible()
    saved = page.locator(".inline-related:not(.empty-form)").filter(
        has=page.locator("input[name$='-tool_glob'][value='fs_delete_files']")
    )
    expect(saved.locator("input[name$='__regex_0']")).to_have_value("^keep/")
    expect(saved.locator("input[name$='__negate_0']")).to_be_checked()
    expect(saved.locator("input[name$='deciders__session_owner']")).not_to_be_checked()
    expect(saved.locator("input[name$='deciders__role_member']")).to_be_checked()
    saved.locator("details.rule-advanced summary").last.click()
    expect(saved.locator("textarea[name$='-deciders']")).to_contain_text('"roles": [\n    "member"\n  ]')
