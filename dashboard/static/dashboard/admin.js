// TaskForge's additions to the Django admin. No inline handlers: the pages carry a CSP.
// An input marked data-select-on-focus (the API key shown once) selects its text on focus.
document.addEventListener("focusin", function (event) {
  var target = event.target;
  if (target instanceof HTMLInputElement && target.hasAttribute("data-select-on-focus")) {
    target.select();
  }
});
