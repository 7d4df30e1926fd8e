"""The Streamlit pages: one thin script per question (app.py routes to them), and the widgets
and views they share (``ui``). Each page is also runnable on its own (AppTest)."""
