// The playground's code editor: CodeMirror 6 with Python highlighting, bundled by
// ui/build.sh into one file that the page loads from <endpoint>/ui/editor.js.  The page
// works without it (a textarea): this only offers window.MPSEditor.create.
import { EditorState } from "@codemirror/state";
import { EditorView, keymap, lineNumbers, highlightActiveLine } from "@codemirror/view";
import { defaultKeymap, history, historyKeymap, indentWithTab } from "@codemirror/commands";
import { syntaxHighlighting, defaultHighlightStyle, indentOnInput, bracketMatching } from "@codemirror/language";
import { python } from "@codemirror/lang-python";

// create(parent, text, onRun): an editor in parent; onRun is called on Ctrl/Cmd-Enter.
// Returns { get(), set(text), focus() }.
function create(parent, text, onRun) {
  const run = () => {
    onRun();
    return true;
  };
  const view = new EditorView({
    parent,
    state: EditorState.create({
      doc: text,
      extensions: [
        lineNumbers(),
        history(),
        indentOnInput(),
        bracketMatching(),
        highlightActiveLine(),
        syntaxHighlighting(defaultHighlightStyle, { fallback: true }),
        python(),
        keymap.of([{ key: "Mod-Enter", run }, indentWithTab, ...defaultKeymap, ...historyKeymap]),
        // The page says how to leave it (Escape then Tab, the view's own tab-focus mode).
        EditorView.contentAttributes.of({ "aria-label": "Python script", "aria-describedby": "editor-keys", "data-testid": "editor" }),
      ],
    }),
  });
  return {
    get: () => view.state.doc.toString(),
    set: (t) => view.dispatch({ changes: { from: 0, to: view.state.doc.length, insert: t } }),
    focus: () => view.focus(),
  };
}

window.MPSEditor = { create };
