"""Plotly figures and circuitsvis views of analysis results."""
