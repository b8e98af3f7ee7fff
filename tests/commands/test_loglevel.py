from kubectl_meshdoctor.commands.log_level import ProxyLevels, render_table


def test_summary_names_the_common_level_and_the_exceptions():
    levels = {"admin": "warning", "connection": "debug", "http": "warning", "misc": "error"}
    p = ProxyLevels("reviews-1", levels)
    assert p.summary() == "warning (2 loggers); connection: debug, misc: error"


def test_table_lists_changed_loggers_even_at_the_common_level():
    levels = {"admin": "debug", "http": "debug", "misc": "error"}
    out = render_table([ProxyLevels("a", levels), ProxyLevels("bb", levels)], changed=("http",))
    assert out.splitlines()[0] == "POD  LEVELS"
    assert out.splitlines()[1] == "a    debug (2 loggers); misc: error; http: debug"
