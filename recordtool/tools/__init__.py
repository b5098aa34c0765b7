"""The tools: measurements of the library against itself and its peers (bench, train_bench,
peers, tune, fidelity, plots). The library never imports them; they may pull optional packages
(torch, DALI, matplotlib, scikit-image)."""
