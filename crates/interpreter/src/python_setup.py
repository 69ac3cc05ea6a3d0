# oka-interpreter runs this silently in every python kernel it starts, before the kernel's first
# execution: the display formatters that give E2B's result types (the code interpreter SDK's
# `Result.data`, `Result.chart`, `Result.json`). Everything is defined inside one function, so
# the user's namespace gets no names; libraries are looked up only when an object of theirs is
# displayed, so a kernel without pandas or matplotlib pays nothing.
def __oka_setup():
    import json
    import math
    import sys
    import warnings

    from IPython import get_ipython
    from IPython.core.formatters import BaseFormatter, JSONFormatter
    from traitlets import ObjectName, Unicode

    def plain(v):
        """A JSON value for one cell of a table: timestamps as ISO 8601, numpy scalars as
        Python numbers, NaN and infinities as null (JSON has none)."""
        if hasattr(v, "isoformat"):
            return v.isoformat()
        if hasattr(v, "item") and callable(v.item):
            try:
                v = v.item()
            except (TypeError, ValueError):
                return str(v)
        if isinstance(v, float) and not math.isfinite(v):
            return None
        if v is None or isinstance(v, (bool, int, float, str)):
            return v
        return str(v)

    class DataFormatter(BaseFormatter):
        """`e2b/data`: a pandas DataFrame as its columns (column name -> values)."""

        format_type = Unicode("e2b/data")
        print_method = ObjectName("_repr_e2b_data_")
        _return_type = (dict, str)

        def __call__(self, obj):
            pandas = sys.modules.get("pandas")
            if pandas is None or not isinstance(obj, pandas.DataFrame):
                return super().__call__(obj)
            columns = obj.to_dict(orient="list")
            return {str(name): [plain(v) for v in values] for name, values in columns.items()}

    class ChartFormatter(BaseFormatter):
        """`e2b/chart`: a matplotlib figure as E2B's typed chart (the `e2b-charts` package)."""

        format_type = Unicode("e2b/chart")
        print_method = ObjectName("_repr_e2b_chart_")
        _return_type = (dict, str)

        def __call__(self, obj):
            figure = sys.modules.get("matplotlib.figure")
            if figure is None or not isinstance(obj, figure.Figure):
                return super().__call__(obj)
            try:
                from e2b_charts import chart_figure_to_dict

                # Its models warn (on the user's stderr) about numpy values they serialize.
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    chart = chart_figure_to_dict(obj)
                # Through JSON and back, so that a value JSON cannot hold fails here, not in
                # the kernel's message.
                return json.loads(json.dumps(chart, allow_nan=False, default=plain)) or None
            except Exception:
                return None

    class ListDictJSONFormatter(JSONFormatter):
        """`application/json` for lists and dicts too (as E2B's template does), when they are
        plain JSON."""

        def __call__(self, obj):
            if isinstance(obj, (list, dict)):
                try:
                    return json.loads(json.dumps(obj, allow_nan=False, default=plain))
                except (TypeError, ValueError):
                    pass
            return super().__call__(obj)

    ip = get_ipython()
    if ip is None:
        return
    formatters = ip.display_formatter.formatters
    formatters["e2b/data"] = DataFormatter(parent=ip.display_formatter)
    formatters["e2b/chart"] = ChartFormatter(parent=ip.display_formatter)
    formatters["application/json"] = ListDictJSONFormatter(parent=ip.display_formatter)


__oka_setup()
del __oka_setup
