// word_count in Node.js: arguments as JSON on stdin, the result as JSON on stdout.
let input = "";
process.stdin.setEncoding("utf8");
process.stdin.on("data", (chunk) => { input += chunk; });
process.stdin.on("end", () => {
  const { text } = JSON.parse(input);
  if (text.trim() === "") {
    console.log(JSON.stringify({ error: { code: "INVALID_ARGUMENTS", message: "text is empty",
                                          hint: "Pass the text to count." } }));
    process.exit(1);
  }
  const words = text.split(/\s+/).filter((w) => w.length > 0).length;
  const lines = (text.match(/\n/g) || []).length + (text.endsWith("\n") ? 0 : 1);
  console.log(JSON.stringify({ words, lines, language: "node" }));
});
