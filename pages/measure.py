"""GPU measurement page: placeholder until the measurement issue lands (another engineer's file)."""

import streamlit as st

st.title("GPU measurement")
st.info("Coming: run real attention implementations on a GPU and compare measured peaks with the analytic model.")
